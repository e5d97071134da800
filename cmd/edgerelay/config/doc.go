// Package config defines every setting of `edgerelay serve` once and reads
// them from four layers, lowest precedence first:
//
//  1. the default written in the table below (see [All]);
//  2. an optional config file, named by --config or RELAY_CONFIG;
//  3. the environment, RELAY_* variables;
//  4. command-line flags.
//
// Each setting has one environment name (RELAY_MAILBOX_LISTEN) and one flag
// name derived from it (--mailbox-listen: lower case, RELAY_ stripped,
// underscores turned into dashes). Defining a setting in one table is what
// keeps the flag, the environment variable, `edgerelay serve --help` and the
// README's table from drifting apart: [Usage] and [MarkdownTable] print the
// same table that [Load] reads.
//
// A value that is present but empty is "set", not "absent": for a listen
// address it turns that service off (RELAY_TURN_LISTEN= disables TURN), which
// is why [Values.IsSet] exists and why the environment is passed in as a
// slice rather than read with os.Getenv, which cannot tell the two apart.
// The environment is never read from the process inside this package, so
// tests control it completely; the package holds no mutable state.
//
// Two settings are secrets (RELAY_TURN_SECRET, RELAY_CF_TURN_API_TOKEN).
// They are never printed by [Usage], [MarkdownTable], [Values.LogValue] or an
// error message, and the typed [Config] carries them as [Secret], which
// prints, logs and marshals as "[redacted]".
package config
