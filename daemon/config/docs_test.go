package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// docRow is one option row of docs/configuration.md: | option | environment
// | default | meaning |.
type docRow struct {
	flag, arg, env, def string
}

// optionCell matches the first cell of an option row: `--name ARG` or
// `-x`, `--name ARG` (the ARG may contain an escaped |).
var optionCell = regexp.MustCompile("^(?:`-[a-z]`, )?`--([a-z0-9-]+)(?: ([^`]*))?`$")

// docOptions reads the rows of the daemon's option tables.
func docOptions(t *testing.T) map[string]docRow {
	t.Helper()
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]docRow{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "| `-") {
			continue
		}
		// Split on | not escaped as \|.
		cells := regexp.MustCompile(`\s*(?:^|[^\\])\|\s*`).Split(strings.TrimSpace(line), -1)
		if len(cells) < 5 {
			continue // a table of another tool: | option | default | meaning |
		}
		cells = cells[1 : len(cells)-1]
		m := optionCell.FindStringSubmatch(cells[0])
		if m == nil || !strings.HasPrefix(strings.Trim(cells[1], "`"), "BYPASSD_") {
			continue
		}
		rows[m[1]] = docRow{flag: m[1], arg: strings.ReplaceAll(m[2], `\|`, "|"), env: strings.Trim(cells[1], "`"), def: cells[2]}
	}
	return rows
}

// normDefault compares defaults as a reader sees them: without backticks
// and parentheses.
func normDefault(s string) string {
	return strings.Join(strings.Fields(strings.NewReplacer("`", "", "(", "", ")", "").Replace(s)), " ")
}

// Every setting has its row in docs/configuration.md, with the same
// argument, environment variable and default; every row there is a
// setting (or --config): adding an option without documenting it, or
// removing one and leaving its row, fails here.
func TestSettingsMatchDocs(t *testing.T) {
	rows := docOptions(t)
	for _, s := range settings {
		r, ok := rows[s.name]
		if !ok {
			t.Errorf("--%s (%s) has no row in docs/configuration.md", s.name, s.env)
			continue
		}
		delete(rows, s.name)
		if r.env != s.env {
			t.Errorf("--%s: docs say environment %s, the code reads %s", s.name, r.env, s.env)
		}
		if r.arg != s.arg {
			t.Errorf("--%s: docs say argument %q, --help says %q", s.name, r.arg, s.arg)
		}
		if d, want := normDefault(r.def), normDefault(s.def); !strings.HasPrefix(d, want) {
			t.Errorf("--%s: docs say default %q, --help says %q", s.name, r.def, s.def)
		}
	}
	delete(rows, "config")
	for name := range rows {
		t.Errorf("docs/configuration.md documents --%s, which bypassd does not have", name)
	}
}
