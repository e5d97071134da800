package mailbox_test

import (
	"edgerelay/fastpath/mailbox"
	"edgerelay/push/apns"
	"edgerelay/push/fcm"
)

type mailboxPushers struct {
	APNs *apns.Client
	FCM  *fcm.Client
}

func (p mailboxPushers) Pushers() mailbox.Pushers { return mailbox.Pushers{APNs: p.APNs, FCM: p.FCM} }
