package turn

import (
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // the TURN REST scheme and RFC 8489's MESSAGE-INTEGRITY are HMAC-SHA1 by definition.
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	pionturn "github.com/pion/turn/v4"
)

// Credentials mints coturn TURN REST API credentials for label, valid for
// ttl from now: username "<unix expiry>:<label>", password
// base64(HMAC-SHA1(secret, username)). The mailbox ice endpoint hands these
// to devices; this server (and coturn run with --use-auth-secret and the
// same secret) accepts them until the expiry.
func Credentials(secret, label string, ttl time.Duration, now time.Time) (username, password string) {
	username = strconv.FormatInt(now.Add(ttl).Unix(), 10) + ":" + label
	return username, restPassword(secret, username)
}

// restPassword is the REST scheme's password for username.
func restPassword(secret, username string) string {
	mac := hmac.New(sha1.New, []byte(secret))
	mac.Write([]byte(username))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// restExpiry parses the unix expiry at the front of a REST username
// ("<expiry>:<label>", or a bare "<expiry>" as coturn also accepts).
func restExpiry(username string) (expiry int64, ok bool) {
	ts, _, _ := strings.Cut(username, ":")
	if ts == "" || len(ts) > 19 {
		return 0, false
	}
	expiry, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || expiry < 0 {
		return 0, false
	}
	return expiry, true
}

// restLabel is the part of a REST username after the expiry. Quotas are
// counted per label, as coturn counts them per "real" username, so that
// minting a fresh expiry does not open a fresh quota.
func restLabel(username string) string {
	if _, label, ok := strings.Cut(username, ":"); ok {
		return label
	}
	return username
}

// longTermKey is RFC 8489's long-term credential key for a REST
// username: MD5(username ":" realm ":" password).
func longTermKey(secret, username, realm string) []byte {
	return pionturn.GenerateAuthKey(username, realm, restPassword(secret, username))
}
