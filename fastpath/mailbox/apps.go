package mailbox

import (
	"fmt"
	"strings"
)

// App is one entry of RELAY_APPS: its name is the first path segment after
// /v1/, and its options turn extensions on.
type App struct {
	Name string
	// PushTopic is the APNs topic (bundle id) of push=<topic>; "" = push off.
	PushTopic string
	Signal    bool
	ICE       bool
}

// ParseApps reads RELAY_APPS: apps separated by ';', each `name` or
// `name:opt,opt,…` with options push=<topic>, signal, ice. Names are 1 to
// 32 of a-z 0-9 -. An error names the bad entry, so that the server
// refuses to start with a message an operator can act on.
func ParseApps(s string) (map[string]App, error) {
	apps := make(map[string]App)
	for _, entry := range strings.Split(s, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, opts, _ := strings.Cut(entry, ":")
		name = strings.TrimSpace(name)
		if !validAppName(name) {
			return nil, fmt.Errorf("RELAY_APPS entry %q: app name must be 1 to 32 of a-z 0-9 -", entry)
		}
		if _, dup := apps[name]; dup {
			return nil, fmt.Errorf("RELAY_APPS entry %q: app %q appears twice", entry, name)
		}
		app := App{Name: name}
		if strings.Contains(entry, ":") {
			for _, opt := range strings.Split(opts, ",") {
				opt = strings.TrimSpace(opt)
				switch {
				case opt == "signal" && !app.Signal:
					app.Signal = true
				case opt == "ice" && !app.ICE:
					app.ICE = true
				case strings.HasPrefix(opt, "push=") && app.PushTopic == "":
					topic := strings.TrimPrefix(opt, "push=")
					if !validTopic(topic) {
						return nil, fmt.Errorf("RELAY_APPS entry %q: push topic %q is not a bundle id", entry, topic)
					}
					app.PushTopic = topic
				default:
					return nil, fmt.Errorf("RELAY_APPS entry %q: unknown or repeated option %q (want push=<topic>, signal, ice)", entry, opt)
				}
			}
		}
		apps[name] = app
	}
	return apps, nil
}

func validAppName(s string) bool {
	if len(s) < 1 || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// validTopic accepts what an APNs topic can be: a bundle id, optionally
// with a suffix such as .voip (letters, digits, '.', '-', '_').
func validTopic(s string) bool {
	if len(s) < 1 || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '.' && c != '-' && c != '_' {
			return false
		}
	}
	return true
}
