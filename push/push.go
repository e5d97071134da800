// Package push holds what the provider modules share with the features that
// call them (the mailbox push and the push gateway).
//
// The provider modules live in subpackages: [edgerelay/push/apns] speaks
// Apple's HTTP/2 provider API with an ES256 provider token, and
// [edgerelay/push/fcm] speaks Firebase Cloud Messaging HTTP v1 with an
// OAuth2 service-account token. Both are safe for concurrent use, keep their
// connections open between sends, bound every request with a timeout and
// retry exactly once when the provider says their credential has gone stale.
// [edgerelay/push/pushtest] holds local fakes of both providers (and of
// Google's token endpoint) that verify credentials and record what arrived.
package push

import "errors"

// ErrNotSent is wrapped by every Send error that happened before a single
// byte of the notification's request reached the provider: an invalid
// notification, a provider token that could not be minted or fetched, a
// connection that could not be opened, a context that ended before the
// request was written.
//
// It exists for the push gateway, which refunds a daily-budget draw only when
// the provider was provably never contacted. Any other Send error means the
// provider may have seen the request; test with errors.Is.
var ErrNotSent = errors.New("push: notification not sent")
