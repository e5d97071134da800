package cluster

// SubjectToken reports whether s may be one token of a NATS subject or a
// KV key built from client input: 1 to 64 of A-Z a-z 0-9 _ - (the union
// of the relay's app, mailbox id and minted id alphabets), so nothing a
// client sends can end a token, widen a subscription (* >) or reach
// another subject.
func SubjectToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
