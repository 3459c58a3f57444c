package manifest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

const example = `
name = "lab-training"

[defaults]                      # applied to every [[jobs]] entry unless overridden
command = ["python", "training/trainer/run.py", "--model", "{model}", "--mode", "{mode}", "--lr={hyper.lr}", "--id", "{task_id}"]
max_attempts = 3
stale_after_s = 600

[[hosts]]
name = "pi"
allow_jobs = ["gbt", "mlp"]
deny_jobs = []

[[jobs]]
model = "gbt"
mode = "realistic"
hyper = { lr = 0.1, depth = 6 }
split_recipe = "v2"
train_hosts = []
seed = 0
priority = 10
require_cuda = false
prefer_cuda = false
min_vram_gib = 0
min_ram_gib = 0
gpus = 0
allowed_hosts = []

[[jobs]]
model = "mlp"
mode = "oracle"
gpus = 2
require_cuda = true
min_vram_gib = 40
max_attempts = 5
[jobs.hyper]
lr = 0.01
layers = [64, 32]
`

func TestParseExample(t *testing.T) {
	m, err := Parse("training.toml", []byte(example))
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "lab-training" || len(m.Hosts) != 1 || len(m.Jobs) != 2 {
		t.Fatalf("got %+v", m)
	}
	if h := m.Hosts[0]; h.Name != "pi" || !h.Allows("gbt") || h.Allows("cnn") {
		t.Errorf("got host %+v, want pi allowing gbt but not cnn", h)
	}
	j := m.Jobs[0]
	if j.Spec.Priority != 10 || j.Spec.MaxAttempts != 3 || j.Spec.StaleAfterS != 600 || j.Spec.GPUs != 0 {
		t.Errorf("got spec %+v", j.Spec)
	}
	if string(j.Spec.Hyper) != `{"depth":6,"lr":0.1}` {
		t.Errorf("got hyper %s, want canonical JSON", j.Spec.Hyper)
	}
	want := []string{"python", "training/trainer/run.py", "--model", "gbt", "--mode", "realistic", "--lr=0.1", "--id", j.ID}
	if strings.Join(j.Spec.Command, " ") != strings.Join(want, " ") {
		t.Errorf("got command %q, want %q", j.Spec.Command, want)
	}
	if j.Name != "gbt-realistic-"+j.ID[:8] {
		t.Errorf("got name %q", j.Name)
	}
	k := m.Jobs[1]
	if k.Spec.GPUs != 2 || !k.Spec.RequireCUDA || k.Spec.MinVRAMGiB != 40 || k.Spec.MaxAttempts != 5 {
		t.Errorf("got spec %+v", k.Spec)
	}
	if string(k.Spec.Hyper) != `{"layers":[64,32],"lr":0.01}` {
		t.Errorf("got hyper %s", k.Spec.Hyper)
	}
	if err := arbiter.ValidateSHA256("id", j.ID); err != nil {
		t.Error(err)
	}
	if len(m.SHA256) != 64 {
		t.Errorf("got file sha %q", m.SHA256)
	}
}

// TestIDStable pins the id of one identity: ids must never change across
// builds, or a reload would duplicate every task.
func TestIDStable(t *testing.T) {
	s := arbiter.TaskSpec{Model: "gbt", Mode: "realistic", Hyper: json.RawMessage(`{"depth":6,"lr":0.1}`), SplitRecipe: "v2", TrainHosts: []string{}, Seed: 0}
	if got := string(Identity(&s)); got != `{"hyper":{"depth":6,"lr":0.1},"mode":"realistic","model":"gbt","seed":0,"split_recipe":"v2","train_hosts":[]}` {
		t.Fatalf("got identity %s", got)
	}
	got := TaskID(&s)
	m, err := Parse("m.toml", []byte(`[[jobs]]
model = "gbt"
mode = "realistic"
split_recipe = "v2"
command = ["x"]
hyper = { lr = 0.1, depth = 6 }
`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Jobs[0].ID != got {
		t.Errorf("parsed id %s differs from TaskID %s", m.Jobs[0].ID, got)
	}
	if got != pinnedID {
		t.Errorf("got id %s, want the pinned %s", got, pinnedID)
	}
}

// pinnedID is the sha256 of the identity in TestIDStable; Python's
// json.dumps(sort_keys=True, separators=(",", ":")) gives the same bytes.
const pinnedID = "53f3b22aa389054dd3bcb71b80725ae6247b6b1eeda8df10c6d9ff48b3630bf4"

func TestIDIgnoresScheduleAndOrder(t *testing.T) {
	a := `[[jobs]]
model = "m"
mode = "x"
hyper = { b = 2, a = 1, nested = { z = 1, y = [1, 2.5, "s"] } }
priority = 1
command = ["run"]
`
	b := `[defaults]
priority = 99
gpus = 3
command = ["other", "{model}"]
[[jobs]]
mode = "x"
model = "m"
[jobs.hyper]
nested = { y = [1, 2.5, "s"], z = 1 }
a = 1
b = 2
`
	ma, err := Parse("a", []byte(a))
	if err != nil {
		t.Fatal(err)
	}
	mb, err := Parse("b", []byte(b))
	if err != nil {
		t.Fatal(err)
	}
	if ma.Jobs[0].ID != mb.Jobs[0].ID {
		t.Errorf("ids differ: %s vs %s", ma.Jobs[0].ID, mb.Jobs[0].ID)
	}
	if mb.Jobs[0].Spec.GPUs != 3 || mb.Jobs[0].Spec.Priority != 99 || mb.Jobs[0].Spec.Command[1] != "m" {
		t.Errorf("defaults not applied: %+v", mb.Jobs[0].Spec)
	}
	// Any identity field changes the id.
	for _, c := range []string{`seed = 1`, `split_recipe = "v3"`, `train_hosts = ["a"]`, `mode = "y"`} {
		doc := strings.Replace(a, "priority = 1", c, 1)
		if c == `mode = "y"` {
			doc = strings.Replace(a, `mode = "x"`, c, 1)
		}
		m, err := Parse("c", []byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		if m.Jobs[0].ID == ma.Jobs[0].ID {
			t.Errorf("%s: id did not change", c)
		}
	}
}

func TestBadManifests(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string // substrings of the error
	}{
		{"unknown top key", "nam = \"x\"\n", []string{"m.toml:1:", "nam", "unknown key"}},
		{"unknown job key", "[[jobs]]\nmodel = \"a\"\ncommand = [\"x\"]\n\n[[jobs]]\nmodel = \"b\"\ngpu = 1\ncommand = [\"x\"]\n",
			[]string{"m.toml:7:", "jobs[1] (b)", "gpu", "keys allowed here are", "gpus"}},
		{"unknown host key", "[[hosts]]\nname = \"pi\"\nallow = [\"x\"]\n", []string{"m.toml:3:", "hosts[0] (pi)", "allow", "unknown key"}},
		{"model in defaults", "[defaults]\nmodel = \"x\"\n", []string{"m.toml:2:", "defaults", "no default"}},
		{"wrong type", "[[jobs]]\nmodel = \"a\"\ngpus = \"two\"\ncommand = [\"x\"]\n", []string{"m.toml:3:", "jobs[0] (a)", "gpus", "whole number"}},
		{"bad gpus", "[[jobs]]\nmodel = \"a\"\nmode = \"r\"\ngpus = 99\ncommand = [\"x\"]\n", []string{"m.toml:4:", "jobs[0] (a/r)", "gpus", "0 to 64"}},
		{"missing model", "[[jobs]]\nmode = \"r\"\ncommand = [\"x\"]\n", []string{"m.toml:1:", "jobs[0]", "model", "missing"}},
		{"missing command", "[[jobs]]\nmodel = \"a\"\n", []string{"jobs[0] (a)", "command", "missing"}},
		{"bad placeholder", "[[jobs]]\nmodel = \"a\"\ncommand = [\"x\", \"{modle}\"]\n", []string{"m.toml:3:", "command[1]", "unknown placeholder {modle}"}},
		{"bad hyper placeholder", "[[jobs]]\nmodel = \"a\"\nhyper = { lr = 1 }\ncommand = [\"x\", \"{hyper.depth}\"]\n", []string{"command[1]", "hyper.depth", "it has lr"}},
		{"unclosed brace", "[[jobs]]\nmodel = \"a\"\ncommand = [\"x\", \"{model\"]\n", []string{"unclosed {"}},
		{"duplicate", "[[jobs]]\nmodel = \"a\"\ncommand = [\"x\"]\n[[jobs]]\nmodel = \"a\"\ncommand = [\"y\"]\npriority = 3\n", []string{"m.toml:4:", "jobs[1] (a)", "same task as jobs[0]"}},
		{"duplicate host", "[[hosts]]\nname = \"pi\"\n[[hosts]]\nname = \"pi\"\n", []string{"m.toml:4:", "hosts[1] (pi)", "already declared"}},
		{"bad host name", "[[hosts]]\nname = \"pi host\"\n", []string{"m.toml:2:", "name"}},
		{"bad pattern", "[[hosts]]\nname = \"pi\"\nallow_jobs = [\"[\"]\n", []string{"m.toml:3:", "allow_jobs[0]"}},
		{"bad allowed host", "[[jobs]]\nmodel = \"a\"\ncommand = [\"x\"]\nallowed_hosts = [\"ok\", \"\"]\n", []string{"m.toml:4:", "allowed_hosts[1]"}},
		{"negative vram", "[[jobs]]\nmodel = \"a\"\ncommand = [\"x\"]\nmin_vram_gib = -1\n", []string{"m.toml:4:", "min_vram_gib"}},
		{"nan ram", "[[jobs]]\nmodel = \"a\"\ncommand = [\"x\"]\nmin_ram_gib = nan\n", []string{"m.toml:4:", "min_ram_gib"}},
		{"zero attempts", "[[jobs]]\nmodel = \"a\"\ncommand = [\"x\"]\nmax_attempts = 0\n", []string{"m.toml:4:", "max_attempts"}},
		{"stale too small", "[defaults]\nstale_after_s = 0\n[[jobs]]\nmodel = \"a\"\ncommand = [\"x\"]\n", []string{"m.toml:2: defaults: stale_after_s"}},
		{"bad default, once", "[defaults]\ncommand = [\"x\"]\ngpus = 99\n\n[[jobs]]\nmodel = \"a\"\n[[jobs]]\nmodel = \"b\"\n", []string{"m.toml:3: defaults: gpus: must be 0 to 64, got 99"}},
		{"date in hyper", "[[jobs]]\nmodel = \"a\"\ncommand = [\"x\"]\nhyper = { when = 2024-01-01 }\n", []string{"m.toml:4:", "hyper", "dates and times"}},
		{"bad model", "[[jobs]]\nmodel = \"a b\"\ncommand = [\"x\"]\n", []string{"m.toml:2:", "model"}},
		{"syntax", "[[jobs]\nmodel = 1\n", []string{"m.toml:1:"}},
		{"empty program", "[[jobs]]\nmodel = \"a\"\ncommand = [\"\"]\n", []string{"command[0]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse("m.toml", []byte(tt.doc))
			if err == nil {
				t.Fatalf("got manifest %+v, want an error", m)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error %q, want it to mention %q", err, w)
				}
			}
		})
	}
}

func TestSeveralProblemsReportedInOrder(t *testing.T) {
	doc := "[[jobs]]\nmodel = \"a\"\ngpus = -1\ncommand = [\"x\"]\n[[jobs]]\nmodel = \"b\"\nmax_attempts = 0\ncommand = [\"x\"]\n"
	_, err := Parse("m.toml", []byte(doc))
	if err == nil {
		t.Fatal("want errors")
	}
	s := err.Error()
	if i, j := strings.Index(s, "m.toml:3:"), strings.Index(s, "m.toml:7:"); i < 0 || j < 0 || i > j {
		t.Errorf("got %q, want the line 3 problem then the line 7 one", s)
	}
}

func TestRead(t *testing.T) {
	m, err := Read("m.toml", strings.NewReader(example))
	if err != nil {
		t.Fatal(err)
	}
	tm := m.TaskManifest()
	if len(tm.Tasks) != 2 || tm.Source != "m.toml" || tm.Tasks[1].Spec.GPUs != 2 || tm.Name != "lab-training" {
		t.Errorf("got %+v", tm)
	}
	big := strings.NewReader("# " + strings.Repeat("x", MaxFileBytes))
	if _, err := Read("big.toml", big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("got %v, want the size limit", err)
	}
}

func TestEmptyManifest(t *testing.T) {
	m, err := Parse("m.toml", nil)
	if err != nil || len(m.Jobs) != 0 {
		t.Fatalf("got %+v, %v", m, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(example))
	f.Add([]byte("[[jobs]]\nmodel = \"a\"\ncommand = [\"{hyper.x}\"]\nhyper = { x = [1, {y = 2}] }\n"))
	f.Add([]byte("[defaults]\nhyper = { a = 1 }\n[[jobs]]\nmodel = \"a\"\ncommand = [\"{{}}\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse("f.toml", data)
		if err != nil {
			if m != nil {
				t.Fatal("manifest and error")
			}
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		seen := map[string]bool{}
		for _, j := range m.Jobs {
			if err := arbiter.ValidateSHA256("id", j.ID); err != nil {
				t.Fatal(err)
			}
			if seen[j.ID] {
				t.Fatalf("duplicate id %s", j.ID)
			}
			seen[j.ID] = true
			if err := j.Spec.Validate(); err != nil {
				t.Fatalf("job %s: %v", j.Name, err)
			}
			if TaskID(&j.Spec) != j.ID {
				t.Fatal("id is not the hash of the identity")
			}
		}
		// Parsing again gives the same ids.
		m2, err := Parse("f.toml", data)
		if err != nil {
			t.Fatal(err)
		}
		for i := range m.Jobs {
			if m.Jobs[i].ID != m2.Jobs[i].ID {
				t.Fatal("ids are not stable")
			}
		}
	})
}

// TestIDMatchesPython: the identity is byte for byte what Python's
// json.dumps(sort_keys=True, separators=(",", ":")) writes for the same
// TOML (tomllib), floats, non-ASCII strings and all; the want values were
// computed by Python 3.
func TestIDMatchesPython(t *testing.T) {
	doc := `[[jobs]]
model = "mlp"
mode = "oracle"
split_recipe = "v2/é"
train_hosts = ["pi", "gpu-ü"]
seed = 7
command = ["x", "--lr={hyper.lr}", "--eps={hyper.eps}"]
hyper = { lr = 1.0, eps = 1e-5, big = 1e22, name = "é😀\"\\\t", n = -3, x = 0.1, y = 1e16, z = 123456789.0, w = 0.0001, v = -0.0, nested = { "ñ" = [1, 2.5, true, "s"] }, u = 1234567890123456.0 }
`
	m, err := Parse("m.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	j := m.Jobs[0]
	want := `{"hyper":{"big":1e+22,"eps":1e-05,"lr":1.0,"n":-3,"name":"\u00e9\ud83d\ude00\"\\\t","nested":{"\u00f1":[1,2.5,true,"s"]},"u":1234567890123456.0,"v":-0.0,"w":0.0001,"x":0.1,"y":1e+16,"z":123456789.0},"mode":"oracle","model":"mlp","seed":7,"split_recipe":"v2/\u00e9","train_hosts":["pi","gpu-\u00fc"]}`
	if got := string(Identity(&j.Spec)); got != want {
		t.Fatalf("identity\n got %s\nwant %s", got, want)
	}
	if j.ID != "01580b506339aac0c3eecb9a338e2c7306518d26365a88102956ea035f7325a4" {
		t.Errorf("got id %s, want Python's", j.ID)
	}
	// Workers get the same canonical hyper-parameters (valid JSON), and
	// {hyper.NAME} is substituted in the same form.
	var h map[string]any
	if err := json.Unmarshal(j.Spec.Hyper, &h); err != nil || h["name"] != "é😀\"\\\t" {
		t.Errorf("hyper %s does not decode: %v %v", j.Spec.Hyper, h, err)
	}
	if got := strings.Join(j.Spec.Command, " "); got != "x --lr=1.0 --eps=1e-05" {
		t.Errorf("got command %q", got)
	}
	// 1 and 1.0 are different TOML values, so different tasks (as in Python).
	a, _ := Parse("a", []byte("[[jobs]]\nmodel = \"m\"\ncommand = [\"x\"]\nhyper = { lr = 1 }\n"))
	b, _ := Parse("b", []byte("[[jobs]]\nmodel = \"m\"\ncommand = [\"x\"]\nhyper = { lr = 1.0 }\n"))
	if a == nil || b == nil || a.Jobs[0].ID == b.Jobs[0].ID {
		t.Errorf("lr = 1 and lr = 1.0 gave the same task")
	}
}

// TestDefaults: what a job that neither it nor [defaults] sets gets.
func TestDefaults(t *testing.T) {
	m, err := Parse("m.toml", []byte("[[jobs]]\nmodel = \"gbt\"\ncommand = [\"run\", \"{name}\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := m.Jobs[0].Spec
	if s.MaxAttempts != 3 || s.StaleAfterS != 600 || s.Priority != 0 || s.GPUs != 0 || s.RequireCUDA || s.PreferCUDA ||
		string(s.Hyper) != "{}" || s.TrainHosts == nil || s.AllowedHosts == nil || s.Mode != "" || s.Seed != 0 {
		t.Fatalf("got spec %+v", s)
	}
	if name := m.Jobs[0].Name; name != "gbt-"+m.Jobs[0].ID[:8] || s.Command[1] != name {
		t.Errorf("got name %q, command %q", name, s.Command)
	}
	// A job's own value wins over [defaults]; hyper merges key by key.
	m, err = Parse("m.toml", []byte("[defaults]\nmax_attempts = 7\nhyper = { a = 1, b = 2 }\ncommand = [\"d\"]\n[[jobs]]\nmodel = \"x\"\nmax_attempts = 2\nhyper = { b = 3 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := m.Jobs[0].Spec; s.MaxAttempts != 2 || string(s.Hyper) != `{"a":1,"b":3}` || s.Command[0] != "d" {
		t.Errorf("got spec %+v", s)
	}
}

// TestTopLevelProblemPlaced: a problem of a top-level key names its line,
// as every other problem does.
func TestTopLevelProblemPlaced(t *testing.T) {
	_, err := Parse("m.toml", []byte("# the manifest\nname = \""+strings.Repeat("n", 200)+"\"\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "m.toml:2: name: ") {
		t.Errorf("got %v, want it placed at m.toml:2", err)
	}
}

// TestBadDefaultReportedOnce: a bad value in [defaults] is reported once,
// at its line, not at every job that takes it; a job that sets the key
// itself is reported at its own line.
func TestBadDefaultReportedOnce(t *testing.T) {
	_, err := Parse("m.toml", []byte("[defaults]\ncommand = [\"x\"]\ngpus = 99\n\n[[jobs]]\nmodel = \"a\"\n[[jobs]]\nmodel = \"b\"\n[[jobs]]\nmodel = \"c\"\ngpus = 70\n"))
	if err == nil {
		t.Fatal("accepted gpus = 99")
	}
	msg := err.Error()
	if n := strings.Count(msg, "gpus: must be"); n != 2 || !strings.Contains(msg, "m.toml:3: defaults: gpus") || !strings.Contains(msg, "m.toml:11: jobs[2] (c): gpus") {
		t.Fatalf("got %q: want the default once at line 3 and job c at line 11", msg)
	}
}

// TestErrorsInInlineTablesNameTheirKey: an unknown key, an unknown
// sub-table or a wrong type is named with its entry and key, inline tables
// included.
func TestErrorsInInlineTablesNameTheirKey(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"defaults = { command = [\"x\"], gpuz = 1 }\n[[jobs]]\nmodel = \"a\"\n", "m.toml:1: defaults: gpuz: unknown key"},
		{"jobs = [\n  { model = \"a\", command = [\"x\"], gpuz = 2 },\n]\n", "m.toml:2: jobs[0] (a): gpuz: unknown key"},
		{"[[jobs]]\nmodel = \"a\"\ncommand = [\"x\"]\n[jobs.extra]\nk = 1\n", "jobs[0] (a): extra"},
		{"jobs = [\n  { model = \"a\", command = [\"x\"] },\n  { model = \"b\", command = [\"x\"], gpus = \"two\" },\n]\n", "m.toml:3: jobs[1]"}, // (its name is not decoded yet)
	} {
		_, err := Parse("m.toml", []byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "extra.extra") || strings.Contains(err.Error(), "top level") {
			t.Errorf("%q: got %v, want %q", c.doc, err, c.want)
		}
	}
}
