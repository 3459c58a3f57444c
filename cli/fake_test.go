package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// fakeArbiter is a small in-memory stand-in for the server's native API:
// one machine "gpu1" with two GPUs, first-fit placement, no queue order.
type fakeArbiter struct {
	srv *httptest.Server

	mu sync.Mutex
	// state of the machine and allocations
	machine arbiter.MachineStatus
	allocs  map[int64]*arbiter.Allocation
	nextID  int64
	// queueAll keeps every new allocation queued until readyOnPoll.
	queueAll bool
	// readyOnPoll places a queued allocation on its next long-poll.
	readyOnPoll bool
	// loseOnKeepalive destroys the allocation when a keepalive arrives.
	loseOnKeepalive bool
	keepalives      int
	lastQuery       string
	requests        []arbiter.Request
}

func newFakeArbiter(t *testing.T) *fakeArbiter {
	t.Helper()
	seen := time.Now().Add(-3 * time.Minute).UTC()
	f := &fakeArbiter{
		allocs: map[int64]*arbiter.Allocation{},
		nextID: 1,
		machine: arbiter.MachineStatus{
			Name: "gpu1", Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, State: arbiter.MachineUp,
			Tags: []string{"default", "h100"}, Cores: 64, RAMGiB: 512, CUDA: "12.4", Driver: "550.54",
			LastSeen: &seen, Free: 2,
			Devices: []arbiter.DeviceStatus{
				{Index: 0, UUID: "GPU-0", Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80, Compute: "9.0", Healthy: true},
				{Index: 1, UUID: "GPU-1", Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80, Compute: "9.0", Healthy: true},
			},
		},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/machines", f.machines)
	mux.HandleFunc("POST /api/v1/machines/{name}/{verb}", f.drain)
	mux.HandleFunc("POST /api/v1/allocations", f.allocate)
	mux.HandleFunc("GET /api/v1/allocations", f.list)
	mux.HandleFunc("GET /api/v1/allocations/{id}", f.get)
	mux.HandleFunc("POST /api/v1/allocations/{id}/keepalive", f.keepalive)
	mux.HandleFunc("DELETE /api/v1/allocations/{id}", f.release)
	mux.HandleFunc("GET /api/v1/events", f.events)
	mux.HandleFunc("GET /api/v1/pools", func(w http.ResponseWriter, _ *http.Request) {
		fakeJSON(w, http.StatusOK, map[string]any{"pools": []any{}})
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func fakeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func fakeError(w http.ResponseWriter, status int, code, msg string) {
	fakeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func (f *fakeArbiter) machines(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fakeJSON(w, 200, map[string]any{"machines": []arbiter.MachineStatus{f.machine}})
}

func (f *fakeArbiter) drain(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.PathValue("name") != f.machine.Name {
		fakeError(w, 404, arbiter.ENotFound, fmt.Sprintf("machine %q does not exist", r.PathValue("name")))
		return
	}
	switch r.PathValue("verb") {
	case "drain":
		f.machine.State = arbiter.MachineDraining
	case "undrain":
		f.machine.State = arbiter.MachineUp
	default:
		fakeError(w, 404, arbiter.ENotFound, "no such route")
		return
	}
	fakeJSON(w, 200, f.machine)
}

func (f *fakeArbiter) allocate(w http.ResponseWriter, r *http.Request) {
	var req arbiter.Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fakeError(w, 400, arbiter.EInvalid, "bad json: "+err.Error())
		return
	}
	if err := req.Validate(); err != nil {
		fakeError(w, 400, arbiter.EInvalid, err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	a := &arbiter.Allocation{ID: f.nextID, Owner: req.Owner, State: arbiter.StateQueued, Request: req,
		Priority: req.Priority, KeepaliveS: req.KeepaliveS, CreatedAt: time.Now().UTC()}
	f.nextID++
	f.allocs[a.ID] = a
	if req.KeepaliveS != nil {
		exp := a.CreatedAt.Add(time.Duration(*req.KeepaliveS * float64(time.Second)))
		a.ExpiresAt = &exp
	}
	if req.TimeLimitS != nil {
		end := a.CreatedAt.Add(time.Duration(*req.TimeLimitS * float64(time.Second)))
		a.EndsAt, a.EndReason = &end, "time limit reached"
	}
	switch {
	case req.GPUs > len(f.machine.Devices):
		a.State = arbiter.StateDestroyed
		a.Reason = arbiter.Str(fmt.Sprintf("no machine has %d GPUs", req.GPUs))
	case !f.queueAll:
		f.place(a)
	}
	if a.State == arbiter.StateQueued {
		a.WhyQueued = arbiter.Str(fmt.Sprintf("gpu1 has %d free GPUs, %d wanted", f.machine.Free, req.GPUs))
	}
	fakeJSON(w, 201, a)
}

// place gives a its GPUs if they are free.
func (f *fakeArbiter) place(a *arbiter.Allocation) {
	if f.machine.Free < a.Request.GPUs {
		return
	}
	now := time.Now().UTC()
	for i := range f.machine.Devices {
		d := &f.machine.Devices[i]
		if d.Allocation != nil || len(a.Devices) == a.Request.GPUs {
			continue
		}
		id := a.ID
		d.Allocation, d.Owner, d.Since = &id, &a.Owner, &now
		a.Devices = append(a.Devices, arbiter.DeviceRef{Machine: "gpu1", Index: d.Index, UUID: d.UUID, Model: d.Model, VRAMGiB: d.VRAMGiB})
	}
	f.machine.Free -= a.Request.GPUs
	a.State, a.Machine, a.WhyQueued, a.ReadyAt = arbiter.StateReady, arbiter.Str("gpu1"), nil, &now
}

func (f *fakeArbiter) destroy(a *arbiter.Allocation, reason string) {
	if a.State == arbiter.StateDestroyed {
		return
	}
	for i := range f.machine.Devices {
		d := &f.machine.Devices[i]
		if d.Allocation != nil && *d.Allocation == a.ID {
			d.Allocation, d.Owner, d.Since = nil, nil, nil
			f.machine.Free++
		}
	}
	now := time.Now().UTC()
	a.State, a.Reason, a.DestroyedAt, a.WhyQueued = arbiter.StateDestroyed, &reason, &now, nil
}

func (f *fakeArbiter) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastQuery = r.URL.RawQuery
	filter := arbiter.AllocationFilter{State: r.FormValue("state"), Owner: r.FormValue("owner"), Machine: r.FormValue("machine")}
	out := []arbiter.Allocation{}
	for id := int64(1); id < f.nextID; id++ {
		if a := f.allocs[id]; filter.Match(a) {
			out = append(out, *a)
		}
	}
	fakeJSON(w, 200, map[string]any{"allocations": out})
}

// lookup finds the allocation named in the path, answering 404 itself.
func (f *fakeArbiter) lookup(w http.ResponseWriter, r *http.Request) *arbiter.Allocation {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	a := f.allocs[id]
	if a == nil {
		fakeError(w, 404, arbiter.ENotFound, fmt.Sprintf("allocation %s does not exist", r.PathValue("id")))
	}
	return a
}

func (f *fakeArbiter) get(w http.ResponseWriter, r *http.Request) {
	wait := r.FormValue("wait") != ""
	f.mu.Lock()
	a := f.lookup(w, r)
	if a == nil {
		f.mu.Unlock()
		return
	}
	if wait && a.State == arbiter.StateQueued && f.readyOnPoll {
		f.place(a)
	}
	queued := a.State == arbiter.StateQueued
	f.mu.Unlock()
	if wait && queued {
		// A real long-poll holds up to wait seconds; a short hold keeps
		// tests fast while still not spinning.
		select {
		case <-time.After(20 * time.Millisecond):
		case <-r.Context().Done():
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fakeJSON(w, 200, a)
}

func (f *fakeArbiter) keepalive(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.lookup(w, r)
	if a == nil {
		return
	}
	f.keepalives++
	if f.loseOnKeepalive {
		f.destroy(a, "keepalive expired")
	}
	if a.State == arbiter.StateDestroyed {
		fakeError(w, 409, arbiter.EConflict, fmt.Sprintf("allocation %d is destroyed", a.ID))
		return
	}
	if a.KeepaliveS != nil {
		exp := time.Now().Add(time.Duration(*a.KeepaliveS * float64(time.Second))).UTC()
		a.ExpiresAt = &exp
	}
	fakeJSON(w, 200, a)
}

func (f *fakeArbiter) release(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.lookup(w, r)
	if a == nil {
		return
	}
	reason := r.FormValue("reason")
	if reason == "" {
		reason = "released"
	}
	f.destroy(a, reason)
	fakeJSON(w, 200, a)
}

func (f *fakeArbiter) events(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	since, _ := strconv.ParseInt(r.FormValue("since"), 10, 64)
	t := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for seq := since + 1; seq <= since+2; seq++ {
		a := arbiter.Allocation{ID: seq, Owner: "alice", State: arbiter.StateReady, Machine: arbiter.Str("gpu1"),
			Devices: []arbiter.DeviceRef{{Machine: "gpu1", Index: 1}}}
		data, _ := json.Marshal(a)
		ev, _ := json.Marshal(arbiter.Event{Seq: seq, Time: t, Kind: arbiter.EventAllocationReady, Subject: fmt.Sprintf("allocation/%d", seq), Data: data})
		fmt.Fprintf(w, ": ping\n\nid: %d\nevent: %s\ndata: %s\n\n", seq, arbiter.EventAllocationReady, ev)
	}
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

func (f *fakeArbiter) alloc(id int64) arbiter.Allocation {
	f.mu.Lock()
	defer f.mu.Unlock()
	if a := f.allocs[id]; a != nil {
		return *a
	}
	return arbiter.Allocation{}
}

// lockedBuffer is a bytes.Buffer safe to read while a command writes it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testEnv returns an Env aimed at url with USER=tester and the outputs.
func testEnv(url string) (*Env, *lockedBuffer, *lockedBuffer) {
	var stdout, stderr lockedBuffer
	vars := map[string]string{"ARBITER_URL": url, "USER": "tester"}
	return &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return vars[k] }}, &stdout, &stderr
}

// runCLI runs the arbiter command line in-process.
func runCLI(t *testing.T, url string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	env, out, errs := testEnv(url)
	code = run(context.Background(), env, args)
	return code, out.String(), errs.String()
}
