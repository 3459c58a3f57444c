package config

import (
	"os"
	"testing"
)

// FuzzParse checks that Parse never panics, that a failure yields no Config,
// and that a Config it returns passes Validate.
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile("example.toml"); err == nil {
		f.Add(data)
	}
	seeds := []string{
		"",
		"[server]\nlisten = \"0.0.0.0:1\"\ninsecure_no_auth = true\n",
		"[[machines]]\nname = \"a\"\ngpus = [{ vram_gib = 80, count = 8, compute = \"9.0\" }]\n",
		"[[machines]]\nname = \"a\"\n[[machines.gpus]]\nvram_gib = 1\n[[machines]]\nname = \"b\"\n",
		"[[tokens]]\nname = \"a\"\nrole = \"admin\"\ntoken_env = \"ADMIN\"\n",
		"[[tokens]]\nname = \"a\"\nrole = \"admin\"\ntoken_file = \"x\"\n",
		"a.b.c = { d = [1, { e = 2 }] }\n",
		"[spalloc]\n[[pools]]\n",
		"server = 1\n",
		"[server]\nlisten = \n",
		"\"quoted.key\" = 1\n['x'.\"y\"]\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// token_file names a path relative to a directory that does not
		// exist, so fuzzing never reads the machine's files.
		c, err := Parse("/nonexistent/fuzz.toml", data, env)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned a Config and %v", err)
			}
			if err.Error() == "" {
				t.Fatalf("empty error message")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate rejects: %v\n%s", err, data)
		}
	})
}
