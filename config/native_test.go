package config

import (
	"testing"
)

// nativeSpecExample is the configuration of docs/reference/native.md, as written
// there, but for one value: the spec's dead link [1, 1, 1, "north"] names a
// board outside its own 1×2 machine (x is 0 only), which is refused
// (TestGridMachinesBad); here it is [0, 1, 1, "north"].
const nativeSpecExample = `
[server]
listen = "127.0.0.1:7070"
data_dir = "./arbiter-data"
database = ""                      # empty = sqlite file in data_dir; or "postgres://…"
spalloc_listen = ""                # e.g. "127.0.0.1:22244"; empty = off

[[tokens]]                         # none configured = open on loopback only
name = "ops"
role = "admin"                     # admin | agent | user
token_env = "ARBITER_ADMIN_TOKEN"  # or token_file = "…"

[[machines]]                       # a GPU host declared statically
name = "gpu1"                      # (agents register hosts dynamically too)
tags = ["default"]
cores = 64
ram_gib = 512
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, compute = "9.0", count = 8 } ]

[[grid_machines]]                  # a spalloc-style machine (docs/reference/spalloc.md)
name = "m"
tags = ["default"]
width = 1                          # triads
height = 2
dead_boards = [[0, 0, 1]]          # [x, y, z]
dead_links = [[0, 1, 1, "north"]]  # [x, y, z, link name]
locations = "identity"             # (x,y,z) -> (cabinet=x, frame=y, board=z); or a table below
base_ip = "10.11.0.0"              # "standard IPs"
queue = "backfill"                 # or "fifo" (strict order, as the reference)
power_delay_s = 0.2                # the built-in power controller's delay

[spalloc]
max_retired_jobs = 1200
seconds_before_free = 30

[tasks]
manifest = ""                      # path of the task manifest (docs/reference/fleet.md); empty = no work queue
operator_token_env = "ARBITER_OPERATOR_TOKEN"   # X-Operator-Token for the fleet /v1 API
max_artifact_bytes = 1073741824

[[pools]]                          # docs/reference/pools.md
name = "small-gpu"
backing = { gpus = 1, min_vram_gib = 40 }
slots = 4
grace_time_s = 60

[[services]]                       # docs/reference/coordination.md
name = "vllm"
machine = "gpu1"
kind = "vllm"                      # or "command"
endpoint = "http://127.0.0.1:8000"
swap_command = ["/opt/vllm/launch.sh", "{model}"]
local_path_roots = ["/models"]
default = true                     # the service the compatible /api/swap endpoints act on
[[services.catalog]]
key = "gemma"
repo = "google/gemma-3-27b-it"     # or local_path = "/models/ten31-v2"
`

// TestNativeSpecExample: the configuration docs/reference/native.md shows loads with
// every key as it is spelled there, and means what it says.
func TestNativeSpecExample(t *testing.T) {
	getenv := func(name string) string {
		return map[string]string{"ARBITER_ADMIN_TOKEN": secret1}[name]
	}
	c, err := Parse("native.toml", []byte(nativeSpecExample), getenv)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Server
	if s.Listen != "127.0.0.1:7070" || s.DataDir != "./arbiter-data" || s.Database != "" || s.SpallocListen != "" {
		t.Errorf("server: %+v", s)
	}
	if len(c.Tokens) != 1 || c.Tokens[0].Name != "ops" || c.Tokens[0].Role != "admin" || c.Tokens[0].Secret != secret1 {
		t.Errorf("tokens: %v", c.Tokens)
	}
	if len(c.Machines) != 1 || c.Machines[0].Name != "gpu1" || c.Machines[0].Cores != 64 || c.Machines[0].RAMGiB != 512 ||
		len(c.Machines[0].GPUs) != 8 || c.Machines[0].GPUs[7].Compute != "9.0" || c.Machines[0].Tags[0] != "default" {
		t.Errorf("machines: %+v", c.Machines)
	}
	if len(c.GridMachines) != 1 || c.GridMachines[0].Name != "m" || c.GridMachines[0].Width != 1 || c.GridMachines[0].Height != 2 ||
		len(c.GridMachines[0].DeadBoards) != 1 || len(c.GridMachines[0].DeadLinks) != 1 {
		t.Errorf("grid machines: %+v", c.GridMachines)
	}
	if c.Spalloc.MaxRetiredJobs != 1200 || c.Spalloc.SecondsBeforeFree != 30 {
		t.Errorf("spalloc: %+v", c.Spalloc)
	}
	if c.Tasks.Manifest != "" || c.Tasks.OperatorTokenEnv != "ARBITER_OPERATOR_TOKEN" || c.Tasks.MaxArtifactBytes != 1<<30 {
		t.Errorf("tasks: %+v", c.Tasks)
	}
	if len(c.Pools) != 1 || c.Pools[0].Name != "small-gpu" || c.Pools[0].Backing.GPUs != 1 || c.Pools[0].Backing.MinVRAMGiB != 40 ||
		c.Pools[0].Slots != 4 || c.Pools[0].GraceTimeS != 60 {
		t.Errorf("pools: %+v", c.Pools)
	}
	if len(c.Services) != 1 || c.Services[0].Name != "vllm" || c.Services[0].Machine != "gpu1" || c.Services[0].Kind != "vllm" ||
		c.Services[0].Endpoint != "http://127.0.0.1:8000" || len(c.Services[0].SwapCommand) != 2 || !c.Services[0].Default ||
		len(c.Services[0].LocalPathRoots) != 1 {
		t.Errorf("services: %+v", c.Services)
	}
	if len(c.Catalog) != 1 || c.Catalog[0].Key != "gemma" || c.Catalog[0].Repo != "google/gemma-3-27b-it" {
		t.Errorf("catalog: %+v", c.Catalog)
	}
}
