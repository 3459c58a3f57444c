package config_test

import (
	"fmt"

	"github.com/arbiter-hq/arbiter/config"
)

func ExampleParse() {
	doc := []byte(`
[server]
listen = "127.0.0.1:7070"

[[machines]]
name = "gpu1"
gpus = [{ model = "NVIDIA L4", vram_gib = 24, compute = "8.9", count = 2 }]
`)
	c, err := config.Parse("arbiter.toml", doc, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	m := c.Machines[0]
	fmt.Println(m.Name, len(m.GPUs), m.GPUs[1].Index, m.GPUs[1].Model)

	bad := []byte("[[machines]]\nname = \"gpu1\"\ngpus = [{ vram_gib = \"24\" }]\n")
	_, err = config.Parse("arbiter.toml", bad, nil)
	fmt.Println(err)
	// Output:
	// gpu1 2 1 NVIDIA L4
	// arbiter.toml:3: machines[0].gpus[0].vram_gib: must be a number of GiB
}
