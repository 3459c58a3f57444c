package arbiter_test

// The repository carries its own documentation (docs/). These tests keep it
// whole: every relative link in every Markdown file resolves, every citation
// of a document in Go source names a file (and a section) that exists, and
// nothing points outside the repository.

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// skipDir reports whether a directory holds no documentation of ours:
// version control, vendored code, test fixtures and hidden folders.
func skipDir(name string) bool {
	return name == "vendor" || name == "testdata" || name == "node_modules" ||
		(strings.HasPrefix(name, ".") && name != ".")
}

// repoFiles returns the slash-separated paths, relative to the module root,
// of the files whose names end in ext, outside the directories skipDir
// names.
func repoFiles(t *testing.T, ext string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ext) {
			out = append(out, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk the repository: %v", err)
	}
	return out
}

// mdLink is one link found in a Markdown file.
type mdLink struct {
	line   int
	target string
}

var (
	// inlineLink matches [text](target) and ![alt](target); the target
	// may carry a title, which mdTarget drops.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+(?:\s+"[^"]*")?)\)`)
	// refDef matches a reference definition: [label]: target.
	refDef = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	// codeSpan matches inline code, whose brackets are not links.
	codeSpan = regexp.MustCompile("`+[^`]*`+")
	// atxHeading matches a heading line: # Title.
	atxHeading = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	// htmlAnchor matches an explicit anchor: <a id="x"> or <a name="x">.
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	// fence opens or closes a fenced code block.
	fence = regexp.MustCompile("^\\s{0,3}(```|~~~)")
	// linkText is a link inside a heading, which renders as its text.
	linkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	// urlScheme starts an absolute URL: https:, mailto:, …
	urlScheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// mdScan returns the links and the heading anchors of a Markdown document,
// ignoring fenced code blocks and inline code.
func mdScan(data []byte) (links []mdLink, anchors map[string]bool, headings []string) {
	anchors = map[string]bool{}
	seen := map[string]int{}
	inFence := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := fence.FindStringSubmatch(line); m != nil {
			switch {
			case inFence == "":
				inFence = m[1]
			case m[1] == inFence:
				inFence = ""
			}
			continue
		}
		if inFence != "" {
			continue
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			slug := githubSlug(m[2])
			if k := seen[slug]; k > 0 {
				anchors[fmt.Sprintf("%s-%d", slug, k)] = true
			} else {
				anchors[slug] = true
			}
			seen[slug]++
			headings = append(headings, m[2])
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		text := codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
			links = append(links, mdLink{n, mdTarget(m[1])})
		}
		if m := refDef.FindStringSubmatch(text); m != nil {
			links = append(links, mdLink{n, mdTarget(m[1])})
		}
	}
	return links, anchors, headings
}

// mdTarget drops a link's title and angle brackets.
func mdTarget(s string) string {
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSuffix(strings.TrimPrefix(s, "<"), ">")
}

// githubSlug is the anchor GitHub gives a heading: the rendered text in
// lower case, without punctuation and symbols, spaces turned into hyphens.
func githubSlug(heading string) string {
	// Rendered text: code spans lose their backticks, links keep their text,
	// emphasis markers go.
	heading = linkText.ReplaceAllString(heading, "$1")
	heading = strings.NewReplacer("`", "", "*", "").Replace(heading)
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), unicode.IsMark(r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func TestGithubSlug(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Concepts", "concepts"},
		{"2.2 control runs the engine", "22-control-runs-the-engine"},
		{"§4 How we test", "4-how-we-test"},
		{"`arbiter alloc`: GPUs, now", "arbiter-alloc-gpus-now"},
		{"The [spalloc](x.md) port", "the-spalloc-port"},
		{"Locks — and swaps", "locks--and-swaps"},
	} {
		if got := githubSlug(c.in); got != c.want {
			t.Errorf("githubSlug(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestMarkdownLinks(t *testing.T) {
	type doc struct {
		anchors map[string]bool
	}
	docs := map[string]*doc{}
	load := func(p string) (*doc, error) {
		if d, ok := docs[p]; ok {
			return d, nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		_, anchors, _ := mdScan(data)
		d := &doc{anchors}
		docs[p] = d
		return d, nil
	}
	files := repoFiles(t, ".md")
	if len(files) == 0 {
		t.Fatal("no Markdown files found: run the test from the module root")
	}
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		links, anchors, _ := mdScan(data)
		for _, l := range links {
			where := fmt.Sprintf("%s:%d: link %q", f, l.line, l.target)
			target := l.target
			if target == "" || strings.HasPrefix(target, "//") || urlScheme.MatchString(target) {
				continue // absolute URL, mailto:, …
			}
			checked++
			file, anchor, _ := strings.Cut(target, "#")
			if file == "" { // #anchor within this file
				if !anchors[anchor] {
					t.Errorf("%s: no heading in %s has the anchor #%s", where, f, anchor)
				}
				continue
			}
			if strings.HasPrefix(file, "/") {
				t.Errorf("%s: use a path relative to the file, not one from the root", where)
				continue
			}
			resolved := path.Clean(path.Join(path.Dir(f), file))
			if resolved == ".." || strings.HasPrefix(resolved, "../") {
				t.Errorf("%s: points outside the repository; a clone would have a dead link", where)
				continue
			}
			st, err := os.Stat(filepath.FromSlash(resolved))
			if err != nil {
				t.Errorf("%s: %s does not exist", where, resolved)
				continue
			}
			if anchor == "" {
				continue
			}
			if st.IsDir() || !strings.HasSuffix(resolved, ".md") {
				t.Errorf("%s: an anchor needs a Markdown file, and %s is not one", where, resolved)
				continue
			}
			d, err := load(filepath.FromSlash(resolved))
			if err != nil {
				t.Fatal(err)
			}
			if !d.anchors[anchor] {
				t.Errorf("%s: no heading in %s has the anchor #%s", where, resolved, anchor)
			}
		}
	}
	if checked == 0 {
		t.Error("no relative links found at all: is the scanner broken?")
	}
}

var (
	// docCite is a citation of a document of the repository: docs/….md,
	// optionally followed by a section, "§2.2".
	docCite = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])(docs/[A-Za-z0-9_./-]+\.md)(?:[,:]? *§ *([0-9]+(?:\.[0-9]+)*))?`)
	// specCite is a bare citation of a specification as they were kept
	// outside the repository ("specs/" and a file name).
	specCite = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])specs/([a-z-]+)\.md`)
	// designCite is "DESIGN §N", the design notes kept outside the
	// repository. (Built from two parts so that this file does not cite it.)
	designCite = regexp.MustCompile("DESIGN" + ` §\s*[0-9]`)
	// specSection is "spec §N", a section of a specification it does not name.
	specSection = regexp.MustCompile(`\bspec §\s*[0-9]`)
)

// sectionHeading matches a heading that starts with section number num:
// "2.2 control …", "4. Allocation", "§4 …".
func sectionHeading(headings []string, num string) bool {
	re := regexp.MustCompile(`^§?\s*` + regexp.QuoteMeta(num) + `\.?(\s|$)`)
	for _, h := range headings {
		if re.MatchString(strings.TrimSpace(h)) {
			return true
		}
	}
	return false
}

func TestGoCitationsOfDocs(t *testing.T) {
	headings := map[string][]string{}
	sections := func(doc string) ([]string, error) {
		if h, ok := headings[doc]; ok {
			return h, nil
		}
		data, err := os.ReadFile(filepath.FromSlash(doc))
		if err != nil {
			return nil, err
		}
		_, _, h := mdScan(data)
		headings[doc] = h
		return h, nil
	}
	for _, f := range repoFiles(t, ".go") {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			where := fmt.Sprintf("%s:%d", f, n+1)
			for _, m := range docCite.FindAllStringSubmatch(line, -1) {
				doc, sec := m[1], m[2]
				h, err := sections(doc)
				if err != nil {
					t.Errorf("%s: cites %s, which does not exist", where, doc)
					continue
				}
				if sec != "" && !sectionHeading(h, sec) {
					t.Errorf("%s: cites %s §%s, but no heading of %s is numbered %s", where, doc, sec, doc, sec)
				}
			}
			for _, m := range specCite.FindAllStringSubmatch(line, -1) {
				t.Errorf("%s: cites specs/%s.md, which is not in the repository: cite docs/reference/%s.md instead", where, m[1], m[1])
			}
			if designCite.MatchString(line) {
				t.Errorf("%s: cites the design notes by section: cite docs/architecture.md §N instead", where)
			}
			if specSection.MatchString(line) {
				t.Errorf("%s: cites a section of an unnamed spec: name it, docs/reference/<surface>.md §N", where)
			}
		}
	}
}

// trackedFiles lists the files git tracks, or, outside a git checkout,
// every file under the module root but version control's.
func trackedFiles(t *testing.T) []string {
	t.Helper()
	if out, err := exec.Command("git", "ls-files", "-z").Output(); err == nil {
		var files []string
		for _, f := range strings.Split(string(out), "\x00") {
			if f != "" {
				files = append(files, f)
			}
		}
		return files
	}
	var files []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			files = append(files, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk the repository: %v", err)
	}
	return files
}

func TestNoPathsOutsideRepository(t *testing.T) {
	// The documents once lived beside the repository; a clone has none of
	// them. (The needles are built so that this file does not hold them.)
	needles := []string{".." + "/shared", "shared" + "/specs", "shared" + "/DESIGN"}
	for _, f := range trackedFiles(t) {
		data, err := os.ReadFile(filepath.FromSlash(f))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree, not yet in the index
			}
			t.Fatal(err)
		}
		if bytes.IndexByte(data, 0) >= 0 {
			continue // binary
		}
		for n, line := range strings.Split(string(data), "\n") {
			for _, s := range needles {
				if strings.Contains(line, s) {
					t.Errorf("%s:%d: mentions %q, outside the repository: link or cite the file under docs/ instead", f, n+1, s)
				}
			}
		}
	}
}

// TestReadmePackageMap: the README's package map names every package of the
// module (and the docs), so that it matches the tree.
func TestReadmePackageMap(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "list", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
		if rel == "" {
			continue
		}
		if !strings.Contains(string(readme), rel+"/") {
			t.Errorf("README.md's package map does not name %s/", rel)
		}
	}
}
