// The layout test: the repository's documents and its packages agree.
// docs/ holds no Go code; this test lives here because it checks the
// documents.
package docs_test

import (
	"bytes"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository root, seen from docs/.
const root = ".."

// packages lists the module's packages (paths relative to the root) and
// their names, as `go list` sees them in this build.
func packages(t *testing.T) map[string]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Name}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, name, _ := strings.Cut(line, " ")
		_, rel, _ := strings.Cut(path, "github.com/bypassd/bypassd")
		pkgs[strings.TrimPrefix(rel, "/")] = name
	}
	return pkgs
}

// No two packages share a name (commands aside): an import path should not
// be needed to know which `tap` a call means.
func TestPackageNamesUnique(t *testing.T) {
	seen := map[string]string{}
	for path, name := range packages(t) {
		if name == "main" {
			continue
		}
		if other, dup := seen[name]; dup {
			t.Errorf("packages %s and %s are both named %s: rename one to say what it is", other, path, name)
		}
		seen[name] = path
	}
}

// Every package has a doc comment that says what it owns: "Package x ..." or
// "Command x ..." on the package clause of one of its files.
func TestPackageDocs(t *testing.T) {
	for path, name := range packages(t) {
		if path == "docs" {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(root, path, "*.go"))
		var doc string
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if af.Doc != nil {
				doc += af.Doc.Text()
			}
		}
		want := "Package " + name + " "
		if name == "main" {
			want = "Command "
		}
		if !strings.HasPrefix(doc, want) || len(strings.Fields(doc)) < 12 {
			t.Errorf("%s: no package doc comment starting %q that says what it owns (got %q)", path, want, doc)
		}
	}
}

// Every package has its row in architecture.md's package tables.
func TestArchitectureListsEveryPackage(t *testing.T) {
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	for path := range packages(t) {
		if path == "docs" {
			continue
		}
		if !bytes.Contains(b, []byte("\n| `"+path+"` |")) {
			t.Errorf("docs/architecture.md has no row for package %s in its package tables (## Packages)", path)
		}
	}
}

// pathToken is a backquoted repository path in a document: it starts with
// a top-level folder. Tokens with placeholders or globs are skipped.
var pathToken = regexp.MustCompile("`((?:bench|bpf|cmd|daemon|deploy|docs|internal|ring|scripts|socket|stats|tap)/[^`\\s]*)`")

// Every path a document names exists, or is a planned home: a path named
// on a line that says "planned" (architecture.md's "Where does X go" marks
// them) may be named anywhere before its folder exists. A moved or deleted
// file must not leave its old path in the docs.
func TestDocumentedPathsExist(t *testing.T) {
	docs, _ := filepath.Glob("*.md")
	docs = append(docs, filepath.Join(root, "README.md"))
	type ref struct {
		path, where string
	}
	var refs []ref
	var planned []string
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			for _, m := range pathToken.FindAllStringSubmatch(line, -1) {
				p := m[1]
				if strings.ContainsAny(p, "<>*{}$") {
					continue
				}
				if strings.Contains(line, "planned") {
					planned = append(planned, strings.TrimSuffix(p, "/"))
					continue
				}
				refs = append(refs, ref{p, fmt.Sprintf("%s:%d", filepath.Base(doc), n+1)})
			}
		}
	}
	for _, r := range refs {
		isPlanned := slices.ContainsFunc(planned, func(home string) bool {
			return r.path == home || strings.HasPrefix(r.path, home+"/")
		})
		if !isPlanned && !exists(r.path) {
			t.Errorf("%s names %s, which does not exist (moved? update the document; a new home? mark it planned in architecture.md's \"Where does X go\")", r.where, r.path)
		}
	}
}

// exists reports whether p names a file or folder of the repository, also
// in the forms documents use: with a trailing slash, a Go identifier after
// a package path (ring/sched/pacing.Table), a trailing "/..." or an
// extension list (steer_bpfel.go/.o).
func exists(p string) bool {
	p = strings.TrimSuffix(strings.TrimSuffix(p, "/..."), "/")
	candidates := []string{p}
	if i := strings.LastIndex(p, "."); i > strings.LastIndex(p, "/") {
		candidates = append(candidates, p[:i])
	}
	if i := strings.Index(p, "/."); i > 0 {
		candidates = append(candidates, p[:i])
	}
	return slices.ContainsFunc(candidates, func(c string) bool {
		_, err := os.Stat(filepath.Join(root, c))
		return err == nil
	})
}
