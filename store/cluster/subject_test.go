package cluster

import (
	"strings"
	"testing"
)

func TestSubjectToken(t *testing.T) {
	for _, ok := range []string{"a", "notes", "AAECAwQFBgcICQoLDA0ODw", "my-app_2", strings.Repeat("x", 64)} {
		if !SubjectToken(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "a.b", "*", ">", "a b", "a\tb", "é", "a/b", strings.Repeat("x", 65), "a\x00"} {
		if SubjectToken(bad) {
			t.Errorf("%q accepted", bad)
		}
	}
}
