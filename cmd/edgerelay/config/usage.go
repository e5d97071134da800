package config

import (
	"fmt"
	"io"
	"strings"
)

// usageIntro is the text above the settings in --help and the paragraph a
// README can put above MarkdownTable.
const usageIntro = `Every setting is a flag, a RELAY_* environment variable, or a line of the
config file (--config FILE or RELAY_CONFIG: lines of RELAY_NAME=value or
flag-name = value, # comments). Precedence, lowest first: default, config
file, environment, flag. Durations are Go durations (10s, 5m, 720h). An
empty listen address turns that service off.
`

// Usage writes what `edgerelay serve --help` prints: for every setting, in
// the order of All, its flag, environment name, default and help. Secrets
// show neither a default nor a value.
func Usage(w io.Writer) {
	var b strings.Builder
	b.WriteString("Usage: edgerelay serve [flags]\n\n")
	b.WriteString(usageIntro)
	var group Group
	for _, s := range All() {
		if s.Group != group {
			group = s.Group
			fmt.Fprintf(&b, "\n%s:\n", group.title())
		}
		b.WriteString("  --" + s.Flag)
		if s.Kind != KindBool {
			b.WriteString(" " + s.Kind.String())
		}
		b.WriteString("  (" + s.Env)
		switch {
		case s.Secret:
			b.WriteString(", secret")
		case s.Default != "":
			b.WriteString(", default " + s.Default)
		}
		b.WriteString(")\n")
		wrap(&b, s.Help, "        ", 80)
	}
	io.WriteString(w, b.String())
}

// wrap writes text in lines of at most width columns (longer words stay
// whole), each line starting with indent.
func wrap(b *strings.Builder, text, indent string, width int) {
	col := 0
	for _, word := range strings.Fields(text) {
		switch {
		case col == 0:
			b.WriteString(indent)
			col = len(indent)
		case col+1+len(word) > width:
			b.WriteString("\n" + indent)
			col = len(indent)
		default:
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += len(word)
	}
	b.WriteByte('\n')
}

// MarkdownTable writes the README's table: one row per setting, in the order
// of All, with columns env, flag, default and meaning. Secrets have no
// default and say so.
func MarkdownTable(w io.Writer) {
	var b strings.Builder
	b.WriteString("| env | flag | default | meaning |\n")
	b.WriteString("|---|---|---|---|\n")
	for _, s := range All() {
		def := ""
		switch {
		case s.Secret:
			def = "*secret*"
		case s.Default != "":
			def = "`" + s.Default + "`"
		}
		fmt.Fprintf(&b, "| `%s` | `--%s` | %s | %s |\n", s.Env, s.Flag, def, markdownText(s.Help))
	}
	io.WriteString(w, b.String())
}

// markdownText escapes what would break a table cell or be taken for HTML
// (RELAY_<SERVICE>_TLS_CERT would otherwise lose "<SERVICE>").
func markdownText(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}
