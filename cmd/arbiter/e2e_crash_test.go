package main

import (
	"context"
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
