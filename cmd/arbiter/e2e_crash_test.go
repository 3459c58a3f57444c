package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
)

// TestKill9MidBatch runs the real binary under load — clients allocating
// and releasing as fast as it answers, so that batches of several commands
// are being written all the time — kills it with SIGKILL at a random
// moment, restarts it and checks that every answer given survived and
// that no batch survived in part: the allocation ids are 1..N with none
// missing, the events are consecutive, and each allocation's last event
// says the state it is in. Several rounds, each continuing on the data of
// the last.
func TestKill9MidBatch(t *testing.T) {
	dir := t.TempDir()
	bin := buildBinary(t)
	cfg := filepath.Join(dir, "arbiter.toml")
	// Nothing retired: every allocation ever answered stays to be checked.
	os.WriteFile(cfg, []byte("[allocations]\nhistory = 1000000\n"+twoHosts), 0o600)
	port := freePort(t)
	url := "http://127.0.0.1:" + port
	start := func() *exec.Cmd {
		return serverProcess(t, bin, url, "--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:"+port)
	}
	c := client.NewWithOptions(url, "", client.Options{Timeout: 5 * time.Second})
	// answered is the latest state each allocation was answered with.
	var mu sync.Mutex
	answered := map[int64]string{}
	note := func(a arbiter.Allocation) {
		mu.Lock()
		defer mu.Unlock()
		if answered[a.ID] != arbiter.StateDestroyed {
			answered[a.ID] = a.State
		}
	}
	for round := 0; round < 4; round++ {
		srv := start()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					a, err := c.Allocate(ctx, arbiter.Request{Owner: fmt.Sprintf("crash-%d", w), GPUs: 1})
					if err != nil {
						return
					}
					note(a)
					r, err := c.Release(ctx, a.ID, "crash test")
					if err != nil {
						return
					}
					note(r)
				}
			}()
		}
		time.Sleep(time.Duration(150+rand.IntN(250)) * time.Millisecond) // a random moment under load
		srv.Process.Signal(syscall.SIGKILL)
		srv.Wait()
		cancel()
		wg.Wait()

		chk := start()
		checkAfterKill(t, url, c, answered)
		chk.Process.Signal(syscall.SIGTERM) // the next round starts on the same data
		chk.Wait()
	}
}

// checkAfterKill checks the restarted server against what was answered.
func checkAfterKill(t *testing.T, url string, c *client.Client, answered map[int64]string) {
	t.Helper()
	ctx := context.Background()
	all, err := c.Allocations(ctx, arbiter.AllocationFilter{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]arbiter.Allocation{}
	for _, a := range all {
		got[a.ID] = a
	}
	for id := int64(1); id <= int64(len(all)); id++ {
		if _, ok := got[id]; !ok {
			t.Fatalf("allocation %d is missing of 1..%d: a batch survived in part, or ids were reused", id, len(all))
		}
	}
	rank := map[string]int{arbiter.StateQueued: 0, arbiter.StateReady: 1, arbiter.StateDestroyed: 2}
	for id, st := range answered {
		a, ok := got[id]
		if !ok {
			t.Fatalf("allocation %d was answered %s, and is gone after kill -9", id, st)
		}
		if rank[a.State] < rank[st] {
			t.Fatalf("allocation %d was answered %s, and is %s after kill -9", id, st, a.State)
		}
	}
	// The events: consecutive, and each allocation's last one says its state.
	last := map[int64]string{}
	var since, prev int64
	for {
		resp, err := http.Get(url + "/api/v1/events?stream=false&limit=10000&since=" + strconv.FormatInt(since, 10))
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Events []arbiter.Event `json:"events"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Events) == 0 {
			break
		}
		for _, e := range page.Events {
			if prev != 0 && e.Seq != prev+1 {
				t.Fatalf("event %d follows event %d: a gap", e.Seq, prev)
			}
			prev = e.Seq
			if id, ok := strings.CutPrefix(e.Subject, "allocation/"); ok {
				n, _ := strconv.ParseInt(id, 10, 64)
				last[n] = e.Kind
			}
		}
		since = prev
	}
	for id, a := range got {
		want := "allocation." + string(a.State)
		if last[id] != want {
			t.Fatalf("allocation %d is %s, but its last event is %q", id, a.State, last[id])
		}
	}
	t.Logf("%d allocations, %d answered, events up to %d: consistent", len(all), len(answered), prev)
}

// TestKill9KeepsUploadedArtifacts: a small upload's bytes travel in the
// batch that records it, and its pack append is not synced before the
// answer. The real binary is killed with SIGKILL right after the answers,
// and its packs are emptied — what a power cut can do to appends never
// synced — before it starts again: every answered upload must still
// download whole, given back to the packs from the batch log.
func TestKill9KeepsUploadedArtifacts(t *testing.T) {
	dir := t.TempDir()
	bin := buildBinary(t)
	manifest := filepath.Join(dir, "tasks.toml")
	var b strings.Builder
	b.WriteString("name = \"k9\"\n[defaults]\ncommand = [\"true\"]\n")
	for i := range 5 {
		fmt.Fprintf(&b, "[[jobs]]\nmodel = \"m\"\nmode = \"k9\"\nseed = %d\n", i)
	}
	os.WriteFile(manifest, []byte(b.String()), 0o600)
	cfg := filepath.Join(dir, "arbiter.toml")
	os.WriteFile(cfg, []byte("[server]\nlocal = false\n[tasks]\nmanifest = \""+manifest+"\"\n"), 0o600)
	port := freePort(t)
	url := "http://127.0.0.1:" + port
	data := filepath.Join(dir, "data")
	start := func() *exec.Cmd {
		return serverProcess(t, bin, url, "--config", cfg, "--data-dir", data, "--listen", "127.0.0.1:"+port)
	}
	call := func(method, path, body string, hdr ...string) string {
		t.Helper()
		code, out := httpDo(t, method, url+path, body, append(hdr, "X-Lab-Host", "k9-worker")...)
		if code >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, code, out)
		}
		return out
	}
	srv := start()
	uploaded := map[string][]byte{}
	for i := range 5 {
		var job struct {
			JobID string `json:"job_id"`
		}
		json.Unmarshal([]byte(call("POST", "/v1/job/claim", `{}`)), &job)
		if job.JobID == "" {
			t.Fatalf("claim %d: no job", i)
		}
		art := []byte(fmt.Sprintf("result %d of %s\n", i, job.JobID))
		sum := sha256.Sum256(art)
		sha := hex.EncodeToString(sum[:])
		call("PUT", "/v1/model/"+job.JobID, string(art), "X-Content-SHA256", sha)
		uploaded[sha] = art
	}
	srv.Process.Signal(syscall.SIGKILL) // right after the last answer
	srv.Wait()
	packs, _ := filepath.Glob(filepath.Join(data, "artifacts", "packs", "*.pack"))
	if len(packs) == 0 {
		t.Fatal("no pack: the small uploads did not go to packs")
	}
	for _, p := range packs {
		if err := os.Truncate(p, 0); err != nil {
			t.Fatal(err)
		}
	}

	start()
	for sha, want := range uploaded {
		if got := call("GET", "/api/v1/artifacts/"+sha+"/content", ""); got != string(want) {
			t.Errorf("artifact %s after kill -9 and emptied packs: %q, want %q", sha[:8], got, want)
		}
	}
}
