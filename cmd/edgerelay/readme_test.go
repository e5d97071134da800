package main

import (
	"os"
	"strings"
	"testing"

	"edgerelay/cmd/edgerelay/config"
)

// TestREADMESettingsTable keeps the README's table of settings equal to the
// one definition in package config. Regenerate the block between the
// markers with config.MarkdownTable when a setting changes.
func TestREADMESettingsTable(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	const begin, end = "<!-- settings table: begin -->\n", "<!-- settings table: end -->"
	i, j := strings.Index(readme, begin), strings.Index(readme, end)
	if i < 0 || j < i {
		t.Fatal("README lacks the settings table markers")
	}
	var want strings.Builder
	config.MarkdownTable(&want)
	if got := readme[i+len(begin) : j]; got != want.String() {
		t.Fatalf("README settings table is stale; replace it with:\n%s", want.String())
	}
}
