package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/arbiter-hq/arbiter/tcpproxy"
)

// High availability end to end (docs/guides/high-availability.md): three
// replicas of the real binary, as processes, on one PostgreSQL schema,
// with a short lease; load through followers and the leader; the leader
// killed, or paused and woken up later; then what every client was told
// is checked against what the new leader holds.

// haTTL is the replicas' lease: short, so a failover takes seconds
// (ARBITER_HA_TTL, in seconds, changes it for a measurement).
var haTTL = func() time.Duration {
	if s, err := strconv.ParseFloat(os.Getenv("ARBITER_HA_TTL"), 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second))
	}
	return 2 * time.Second
}()

// haSecret is the replicas' shared secret.
const haSecret = "replicas-share-this-secret-0123456789"

// haNode is one replica process.
type haNode struct {
	id, url, spalloc string
	cfg              string
	cmd              *exec.Cmd
	logs             *syncBuffer
	exited           chan struct{}
}

// haCluster is the replicas of one test.
type haCluster struct {
	t     *testing.T
	bin   string
	dir   string
	nodes []*haNode
	// tasks is how many test tasks the manifest holds.
	tasks int
}

const haMachines = `
[[machines]]
name = "gpu1"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, count = 4 } ]
[[machines]]
name = "gpu2"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, count = 4 } ]
[[machines]]
name = "gpu3"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, count = 4 } ]
[[machines]]
name = "gpu4"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, count = 4 } ]

[[grid_machines]]
name = "m"
width = 4
height = 2
locations = "identity"
base_ip = "10.11.0.0"
power_delay_s = 0
`

// newHACluster writes the configurations of n replicas on the database
// dbFor(i) (the test's own schema) and the task manifest; start runs them.
func newHACluster(t *testing.T, n int, dbFor func(i int) string) *haCluster {
	t.Helper()
	c := &haCluster{t: t, bin: buildBinary(t), dir: t.TempDir(), tasks: 40}
	if err := os.WriteFile(filepath.Join(c.dir, "secret"), []byte(haSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	var man strings.Builder
	man.WriteString("name = \"ha\"\n[defaults]\nstale_after_s = 120\nmax_attempts = 5\ncommand = [\"true\"]\n")
	for i := range c.tasks {
		fmt.Fprintf(&man, "[[jobs]]\nmodel = \"t%d\"\nmode = \"x\"\nallowed_hosts = [\"tw-*\"]\n", i)
	}
	// The real agent's task: it runs across the failover.
	man.WriteString("[[jobs]]\nmodel = \"long\"\nmode = \"agent\"\nallowed_hosts = [\"ha-agent\"]\n" +
		"command = [\"sh\", \"-c\", \"sleep 5; echo survived > \\\"$ARBITER_OUTPUT_DIR/r.txt\\\"\"]\n")
	if err := os.WriteFile(filepath.Join(c.dir, "tasks.toml"), []byte(man.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		port, sport := freePort(t), freePort(t)
		nd := &haNode{id: fmt.Sprintf("r%d", i), url: "http://127.0.0.1:" + port, spalloc: "127.0.0.1:" + sport,
			cfg: filepath.Join(c.dir, fmt.Sprintf("r%d.toml", i))}
		conf := fmt.Sprintf(`[server]
listen = "127.0.0.1:%s"
database = %q
spalloc_listen = "127.0.0.1:%s"
shutdown_timeout_s = 2
[agents]
heartbeat_timeout_s = 3600
[tasks]
manifest = "tasks.toml"
[spalloc]
seconds_before_free = 0
max_retired_jobs = 100000
[allocations]
history = 100000
%s
[ha]
enabled = true
node_id = %q
advertise_url = %q
lease_ttl_s = %v
secret_file = "secret"
`, port, dbFor(i), sport, haMachines, nd.id, nd.url, haTTL.Seconds())
		if err := os.WriteFile(nd.cfg, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, nd)
	}
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			c.kill(nd)
		}
		if t.Failed() {
			for _, nd := range c.nodes {
				if nd.logs != nil {
					t.Logf("replica %s log:\n%s", nd.id, nd.logs.String())
				}
			}
		}
	})
	return c
}

// start runs replica i (data_dir shared: the artifacts must be where
// every leader finds them).
func (c *haCluster) start(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	nd.cmd = exec.Command(c.bin, "server", "--config", nd.cfg, "--data-dir", filepath.Join(c.dir, "data"))
	nd.logs = &syncBuffer{}
	nd.cmd.Stdout, nd.cmd.Stderr = nd.logs, nd.logs
	if err := nd.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	nd.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		cmd.Wait()
		close(done)
	}(nd.cmd, nd.exited)
	poll.Until(c.t, 30*time.Second, "replica "+nd.id+" to answer its health", func() bool {
		_, err := c.health(i)
		return err == nil
	})
}

// kill ends a replica with SIGKILL (waking it first if it was paused).
func (c *haCluster) kill(nd *haNode) {
	if nd.cmd == nil || nd.cmd.Process == nil {
		return
	}
	nd.cmd.Process.Signal(syscall.SIGKILL)
	<-nd.exited
	nd.cmd = nil
}

func (c *haCluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	if err := c.nodes[i].cmd.Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
}

// health is replica i's own view (a follower answers it itself).
func (c *haCluster) health(i int) (arbiter.Cluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.nodes[i].url+"/api/v1/health", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return arbiter.Cluster{}, err
	}
	defer resp.Body.Close()
	var h arbiter.Cluster
	err = json.NewDecoder(resp.Body).Decode(&h)
	return h, err
}

// leader is the replica that says it leads, -1 for none; of several, the
// test fails.
func (c *haCluster) leader(skip ...int) int {
	c.t.Helper()
	found := -1
	for i := range c.nodes {
		if slices.Contains(skip, i) || c.nodes[i].cmd == nil {
			continue
		}
		if h, err := c.health(i); err == nil && h.Role == arbiter.ReplicaLeader {
			if found >= 0 {
				c.t.Fatalf("replicas %d and %d both say they lead", found, i)
			}
			found = i
		}
	}
	return found
}

func (c *haCluster) waitLeader(skip ...int) int {
	c.t.Helper()
	l := -1
	poll.Until(c.t, 30*time.Second, "a replica to lead", func() bool { l = c.leader(skip...); return l >= 0 })
	return l
}

// urls lists every replica's URL, starting with replica first: a client
// of them sticks to the first that answers.
func (c *haCluster) urls(first int) string {
	var out []string
	for k := range c.nodes {
		out = append(out, c.nodes[(first+k)%len(c.nodes)].url)
	}
	return strings.Join(out, ",")
}

// haLoad is the load the replicas serve while the leader goes, and what
// each client was told.
type haLoad struct {
	c    *haCluster
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	allocs   map[int64]arbiter.Allocation // acknowledged, as answered
	released map[int64]bool               // acknowledged releases
	tried    map[int64]bool               // releases sent, answered or not
	idSeqs   [][]int64                    // per worker, the ids it was given, in order
	fences   [][]int64                    // per lock worker, the fencing numbers, in order
	claims   map[string]int               // task id → successful claims
	jobs     map[int64]bool               // spalloc jobs acknowledged (true: destroyed, acknowledged)
	errs     map[string]int               // errors clients saw, by kind (for the log)
	ops      int
	// drained: the task queue was claimed empty by an earlier load.
	drained bool
}

// startLoad runs allocation, lock, task and spalloc clients against every
// replica, followers and leader alike.
func (c *haCluster) startLoad() *haLoad {
	l := &haLoad{c: c, stop: make(chan struct{}), allocs: map[int64]arbiter.Allocation{}, released: map[int64]bool{}, tried: map[int64]bool{},
		claims: map[string]int{}, jobs: map[int64]bool{}, errs: map[string]int{}}
	n := len(c.nodes)
	// Sized before any worker starts: a worker appends to its own entry
	// under mu, and growing the outer slice then would race with it.
	l.idSeqs = make([][]int64, 2*n)
	l.fences = make([][]int64, n)
	for k := range 2 * n {
		l.run(func() { l.allocate(k, client.New(c.urls(k%n), "")) })
	}
	for k := range n {
		l.run(func() { l.lock(k, client.New(c.urls(k), "")) })
		l.run(func() { l.claim(k, client.New(c.urls(k), "")) })
		l.run(func() { l.spallocJobs(k) })
	}
	return l
}

func (l *haLoad) run(f func()) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
}

// done is how many operations were acknowledged so far.
func (l *haLoad) done() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ops
}

func (l *haLoad) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// end stops the load and waits for every client.
func (l *haLoad) end() {
	close(l.stop)
	l.wg.Wait()
}

func (l *haLoad) fail(kind string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := err.Error()
	if ae := (*arbiter.Error)(nil); errors.As(err, &ae) {
		msg = ae.Message
	}
	l.errs[kind+": "+arbiter.Clip(msg, 70)]++
}

func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// allocate asks for one GPU at a time, keeping at most one, releasing the
// older.
func (l *haLoad) allocate(k int, cl *client.Client) {
	var live []int64
	for !l.stopped() {
		ctx, cancel := callCtx()
		a, err := cl.Allocate(ctx, arbiter.Request{Owner: fmt.Sprintf("w%d", k), GPUs: 1})
		cancel()
		if err != nil {
			l.fail("allocate", err)
			continue
		}
		l.mu.Lock()
		l.allocs[a.ID] = a
		l.idSeqs[k] = append(l.idSeqs[k], a.ID)
		l.ops++
		l.mu.Unlock()
		live = append(live, a.ID)
		for len(live) > 1 {
			l.mu.Lock()
			l.tried[live[0]] = true
			l.mu.Unlock()
			ctx, cancel := callCtx()
			_, err := cl.Release(ctx, live[0], "")
			cancel()
			if err != nil {
				l.fail("release", err)
				break // the next round tries again
			}
			l.mu.Lock()
			l.released[live[0]] = true
			l.ops++
			l.mu.Unlock()
			live = live[1:]
		}
	}
}

// lock takes and gives back a lock of its own, over and over; a take whose
// answer was lost is undone by force.
func (l *haLoad) lock(k int, cl *client.Client) {
	name := fmt.Sprintf("lock-%d", k)
	ttl := 60.0
	for !l.stopped() {
		ctx, cancel := callCtx()
		g, err := cl.AcquireLock(ctx, name, client.LockRequest{Holder: fmt.Sprintf("w%d", k), TTLS: &ttl})
		cancel()
		if err != nil {
			l.fail("lock", err)
			if arbiter.ErrorCode(err) == arbiter.EConflict || arbiter.ErrorCode(err) == arbiter.ELocked {
				ctx, cancel := callCtx()
				cl.ReleaseLock(ctx, name, "", true)
				cancel()
			}
			continue
		}
		l.mu.Lock()
		l.fences[k] = append(l.fences[k], g.Fence)
		l.ops++
		l.mu.Unlock()
		ctx, cancel = callCtx()
		_, err = cl.ReleaseLock(ctx, name, g.Token, false)
		cancel()
		if err != nil {
			l.fail("unlock", err)
		}
	}
}

// claim claims tasks as worker tw-k, keeping them (they never go stale
// during the test).
func (l *haLoad) claim(k int, cl *client.Client) {
	worker := fmt.Sprintf("tw-%d", k)
	for !l.stopped() {
		ctx, cancel := callCtx()
		task, err := cl.ClaimTask(ctx, worker, arbiter.Capability{Hostname: worker, Cores: 4, RAMGiB: 8}, client.ClaimOptions{})
		cancel()
		switch {
		case err != nil:
			l.fail("claim", err)
		case task == nil:
			select { // the queue is empty: wait for the end
			case <-l.stop:
			case <-time.After(50 * time.Millisecond):
			}
		default:
			l.mu.Lock()
			l.claims[task.ID]++
			l.ops++
			l.mu.Unlock()
		}
	}
}

// spallocJobs creates and destroys spalloc jobs through replica k's
// spalloc port, reconnecting when the connection drops.
func (l *haLoad) spallocJobs(k int) {
	addr := l.c.nodes[k].spalloc
	var conn net.Conn
	var r *bufio.Reader
	call := func(line string) (json.RawMessage, error) {
		if conn == nil {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				return nil, err
			}
			conn, r = c, bufio.NewReader(c)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, line+"\n"); err != nil {
			conn.Close()
			conn = nil
			return nil, err
		}
		reply, err := r.ReadString('\n')
		if err != nil {
			conn.Close()
			conn = nil
			return nil, err
		}
		var env struct {
			Return    json.RawMessage `json:"return"`
			Exception *string         `json:"exception"`
		}
		if err := json.Unmarshal([]byte(reply), &env); err != nil || env.Exception != nil {
			return nil, fmt.Errorf("%s: %s", line, reply)
		}
		return env.Return, nil
	}
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for !l.stopped() {
		ret, err := call(`{"command": "create_job", "args": [], "kwargs": {"owner": "s", "keepalive": null}}`)
		if err != nil {
			l.fail("create_job", err)
			select {
			case <-l.stop:
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		id, err := strconv.ParseInt(string(ret), 10, 64)
		if err != nil {
			l.fail("create_job", err)
			continue
		}
		l.mu.Lock()
		l.jobs[id] = false
		l.ops++
		l.mu.Unlock()
		if _, err := call(fmt.Sprintf(`{"command": "destroy_job", "args": [%d, "done"], "kwargs": {}}`, id)); err != nil {
			l.fail("destroy_job", err)
			continue
		}
		l.mu.Lock()
		l.jobs[id] = true
		l.mu.Unlock()
	}
}

// check holds the cluster to every answer a client was given: each
// acknowledged allocation and release is in the state the new leader
// loaded, no GPU is held twice, ids and fencing numbers only grew, no task
// was claimed twice, every acknowledged spalloc job is known.
func (l *haLoad) check() {
	t := l.c.t
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	cl := client.New(l.c.urls(0), "")
	ctx := context.Background()
	for id, a := range l.allocs {
		got, err := cl.Allocation(ctx, id)
		if err != nil {
			t.Fatalf("acknowledged allocation %d: %v", id, err)
		}
		switch {
		case l.released[id] && got.State != arbiter.StateDestroyed:
			t.Errorf("allocation %d: release acknowledged, but it is %s", id, got.State)
		case !l.tried[id] && got.State == arbiter.StateDestroyed:
			t.Errorf("allocation %d: destroyed (%v) though nobody released it", id, got.Reason)
		case a.State == arbiter.StateReady && (got.Machine == nil || *got.Machine != *a.Machine || len(got.Devices) != 1 || got.Devices[0].Index != a.Devices[0].Index):
			t.Errorf("allocation %d: acknowledged on %v %v, now %v %v", id, a.Machine, a.Devices, got.Machine, got.Devices)
		}
	}
	live, err := cl.Allocations(ctx, arbiter.AllocationFilter{State: arbiter.StateReady})
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int64{}
	for _, a := range live {
		for _, d := range a.Devices {
			key := fmt.Sprintf("%s:%d", d.Machine, d.Index)
			if other, ok := held[key]; ok {
				t.Errorf("GPU %s is held by allocations %d and %d", key, other, a.ID)
			}
			held[key] = a.ID
		}
	}
	seen := map[int64]bool{}
	for k, ids := range l.idSeqs {
		for i, id := range ids {
			if seen[id] {
				t.Errorf("allocation id %d given twice", id)
			}
			seen[id] = true
			if i > 0 && id <= ids[i-1] {
				t.Errorf("worker %d was given id %d after %d", k, id, ids[i-1])
			}
		}
	}
	for k, fs := range l.fences {
		for i := 1; i < len(fs); i++ {
			if fs[i] <= fs[i-1] {
				t.Errorf("lock-%d: fencing number %d after %d", k, fs[i], fs[i-1])
			}
		}
	}
	for id, n := range l.claims {
		if n > 1 {
			t.Errorf("task %s claimed %d times", id[:12], n)
		}
	}
	if (len(l.claims) == 0 && !l.drained) || len(l.jobs) == 0 || len(l.allocs) == 0 {
		t.Errorf("the load did too little: %d claims, %d spalloc jobs, %d allocations", len(l.claims), len(l.jobs), len(l.allocs))
	}
	for id := range l.claims {
		task, err := cl.Task(ctx, id)
		if err != nil || task.Status != arbiter.TaskClaimed {
			t.Errorf("claimed task %s: %s %v", id[:12], task.Status, err)
		}
	}
	up := 0
	for l.c.nodes[up].cmd == nil {
		up++
	}
	sp, err := net.Dial("tcp", l.c.nodes[up].spalloc)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	br := bufio.NewReader(sp)
	for id, destroyed := range l.jobs {
		sp.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(sp, `{"command": "get_job_state", "args": [%d], "kwargs": {}}`+"\n", id)
		reply, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("get_job_state %d: %v", id, err)
		}
		var env struct {
			Return struct {
				State int `json:"state"`
			} `json:"return"`
		}
		json.Unmarshal([]byte(reply), &env)
		if env.Return.State == 0 || (destroyed && env.Return.State != 4) {
			t.Errorf("spalloc job %d (destroy acknowledged: %v) is now in state %d", id, destroyed, env.Return.State)
		}
	}
	t.Logf("load: %d acknowledged operations: %d allocations, %d releases, %d lock takes, %d claims, %d spalloc jobs; errors seen: %v",
		l.ops, len(l.allocs), len(l.released), sum(l.fences), len(l.claims), len(l.jobs), l.errs)
}

func sum(xs [][]int64) int {
	n := 0
	for _, x := range xs {
		n += len(x)
	}
	return n
}

// takeover waits for a replica other than old to lead and serve a write,
// and returns it and how long after from that was.
func (c *haCluster) takeover(old int, from time.Time) (int, time.Duration) {
	c.t.Helper()
	next := -1
	poll.Until(c.t, 30*time.Second, "a new leader to serve a write", func() bool {
		if next = c.leader(old); next < 0 {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		name := fmt.Sprintf("takeover-%d", time.Now().UnixNano())
		_, err := client.New(c.nodes[next].url, "").AcquireLock(ctx, name, client.LockRequest{Holder: "probe", TTLS: ptr(1.0)})
		return err == nil
	})
	return next, time.Since(from)
}

func ptr[T any](v T) *T { return &v }

// eventWatch follows the event stream through a follower, across the
// failover.
type eventWatch struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	seqs   []int64
}

func (c *haCluster) watchEvents() *eventWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &eventWatch{t: c.t, cancel: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- client.New(c.urls(1), "").Events(ctx, 0, func(e arbiter.Event) error {
			w.mu.Lock()
			w.seqs = append(w.seqs, e.Seq)
			w.mu.Unlock()
			return nil
		})
	}()
	c.t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// check: the stream resumed on the new leader from where it was, every
// event once, in order, none missing, up to the leader's last.
func (w *eventWatch) check(leader string) {
	w.t.Helper()
	h, err := client.New(leader, "").Health(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	last := int64(h["last_seq"].(float64))
	poll.Until(w.t, 30*time.Second, "the event stream to reach the new leader's last event", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.seqs) > 0 && w.seqs[len(w.seqs)-1] >= last
	})
	w.cancel()
	if err := <-w.done; err != nil {
		w.t.Fatalf("the event stream ended: %v", err)
	}
	w.done <- nil // for the cleanup
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := 1; i < len(w.seqs); i++ {
		if w.seqs[i] != w.seqs[i-1]+1 {
			w.t.Fatalf("the event stream went from %d to %d across the failover", w.seqs[i-1], w.seqs[i])
		}
	}
	w.t.Logf("event stream through a follower: %d events, %d to %d, none missing or repeated", len(w.seqs), w.seqs[0], w.seqs[len(w.seqs)-1])
}

// haPostgres returns the test database's URL, skipping without one.
func haPostgres(t *testing.T) string {
	t.Helper()
	url := os.Getenv("ARBITER_TEST_POSTGRES")
	if url == "" {
		t.Skip("ARBITER_TEST_POSTGRES is not set")
	}
	return pgSchemaURL(t, url)
}

// startAll starts the replicas, r0 first (it leads), and the agent.
func (c *haCluster) startAll() {
	for i := range c.nodes {
		c.start(i)
		if i == 0 {
			c.waitLeader()
		}
	}
	poll.Until(c.t, 30*time.Second, "every replica in the roster", func() bool {
		h, err := c.health(0)
		return err == nil && len(h.Replicas) == len(c.nodes)
	})
}

// haAgent runs a real agent on the replicas' URLs; it claims the long task.
func (c *haCluster) haAgent() *syncBuffer {
	_, logs := startAgent(c.t, c.bin, c.urls(1), "ha-agent", nil, "--nvidia-smi", "none", "--cpu-tasks", "1")
	return logs
}

// waitAgentTask waits until the agent's task runs and returns its id.
func (c *haCluster) waitAgentTask() string {
	c.t.Helper()
	cl := client.New(c.urls(0), "")
	id := ""
	poll.Until(c.t, 30*time.Second, "the agent to run its task", func() bool {
		ts, err := cl.Tasks(context.Background(), client.TaskFilter{})
		if err != nil {
			return false
		}
		for _, task := range ts {
			if task.ClaimedBy == "ha-agent" && (task.Status == arbiter.TaskRunning || task.Status == arbiter.TaskClaimed) {
				id = task.ID
				return true
			}
		}
		return false
	})
	return id
}

// checkAgentTask: the agent's task ran through the failover once and
// completed, its heartbeats and its artifact reaching the new leader.
func (c *haCluster) checkAgentTask(id string, logs *syncBuffer) {
	c.t.Helper()
	cl := client.New(c.urls(0), "")
	var task arbiter.Task
	err := poll.Try(30*time.Second, func() error {
		var err error
		if task, err = cl.Task(context.Background(), id); err != nil {
			return err
		}
		if task.Status != arbiter.TaskCompleted {
			return fmt.Errorf("the agent's task is %s", task.Status)
		}
		return nil
	})
	if err != nil || task.Attempts != 1 || task.ArtifactID == "" {
		c.t.Fatalf("the agent's task after the failover: %+v %v\nagent log:\n%s", task, err, logs.String())
	}
}

// TestHAFailoverKill is the first test: load through followers
// and the leader; the leader killed with SIGKILL; a new leader serves
// within 2 × lease_ttl_s, and every acknowledged write is there.
func TestHAFailoverKill(t *testing.T) {
	db := haPostgres(t)
	c := newHACluster(t, 3, func(int) string { return db })
	c.startAll()
	watch := c.watchEvents()
	load := c.startLoad()
	poll.Until(t, 30*time.Second, "the load to get going", func() bool { return load.done() > 200 })
	agentLogs := c.haAgent()
	agentTask := c.waitAgentTask()
	old := c.waitLeader()
	killed := time.Now()
	c.kill(c.nodes[old])
	next, took := c.takeover(old, killed)
	t.Logf("replica %s killed; %s leads and serves after %s", c.nodes[old].id, c.nodes[next].id, took.Round(time.Millisecond))
	if took > 2*haTTL {
		t.Errorf("the new leader served %s after the kill, more than 2 × lease_ttl_s", took)
	}
	before := load.done()
	poll.Until(t, 30*time.Second, "the load to go on under the new leader", func() bool {
		return load.done() > before+200
	})
	load.end()
	load.check()
	c.checkAgentTask(agentTask, agentLogs)
	watch.check(c.nodes[next].url)
	// The agent's heartbeats reach the new leader (last-seen is memory
	// only: the new leader knows it from them alone).
	poll.Until(t, 30*time.Second, "the agent's heartbeat at the new leader", func() bool {
		m, err := client.New(c.nodes[next].url, "").Machine(context.Background(), "ha-agent")
		return err == nil && m.LastSeen != nil && time.Since(*m.LastSeen) < 10*time.Second
	})
	if h, _ := c.health(next); h.Failovers < 1 || h.Term < 2 {
		t.Errorf("the new leader's health: %+v", h)
	}
	// Each replica's metrics say its role: a follower answers them itself.
	follower := 3 - old - next
	for i, want := range map[int][]string{next: {`arbiter_ha_role{role="leader"} 1`, `arbiter_allocations{`},
		follower: {`arbiter_ha_role{role="follower"} 1`, `arbiter_ha_failovers_total 1`}} {
		body := httpGet(t, c.nodes[i].url+"/metrics")
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("replica %s's metrics lack %q", c.nodes[i].id, w)
			}
		}
	}
}

// TestHAFailoverPause: the leader is stopped with SIGSTOP, a new leader
// takes over, and the old one, woken up later with state its memory says
// is due (allocations whose keepalive ran out while it slept), writes
// nothing: it finds it lost the lease and follows.
func TestHAFailoverPause(t *testing.T) {
	db := haPostgres(t)
	c := newHACluster(t, 3, func(int) string { return db })
	c.startAll()
	load := c.startLoad()
	poll.Until(t, 30*time.Second, "the load to get going", func() bool { return load.done() > 200 })
	// Probes: allocations with a keepalive shorter than the pause, kept
	// alive all along through the cluster. The paused leader's memory
	// will say they expired.
	cl := client.New(c.urls(1), "")
	var probes []int64
	for range 3 {
		a, err := cl.Allocate(context.Background(), arbiter.Request{Owner: "probe", GPUs: 1, KeepaliveS: ptr(4.0)})
		if err != nil {
			t.Fatal(err)
		}
		probes = append(probes, a.ID)
	}
	keep := make(chan struct{})
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		for {
			for _, id := range probes {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				cl.Keepalive(ctx, id)
				cancel()
			}
			select {
			case <-keep:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	old := c.waitLeader()
	paused := time.Now()
	c.signal(old, syscall.SIGSTOP)
	next, took := c.takeover(old, paused)
	t.Logf("replica %s paused; %s leads and serves after %s", c.nodes[old].id, c.nodes[next].id, took.Round(time.Millisecond))
	if took > 2*haTTL {
		t.Errorf("the new leader served %s after the pause, more than 2 × lease_ttl_s", took)
	}
	// Sleep on past the probes' keepalive, then wake the zombie.
	poll.Until(t, 30*time.Second, "the pause to outlast the probes' keepalive", func() bool { return time.Since(paused) > 6*time.Second })
	c.signal(old, syscall.SIGCONT)
	// A write sent to the zombie the moment it wakes is either refused or
	// really done by the leader.
	direct := client.New(c.nodes[old].url, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	a, err := direct.Allocate(ctx, arbiter.Request{Owner: "zombie-probe", GPUs: 1})
	cancel()
	if err == nil {
		got, gerr := client.New(c.nodes[next].url, "").Allocation(context.Background(), a.ID)
		if gerr != nil || got.Owner != "zombie-probe" {
			t.Errorf("the woken leader acknowledged allocation %d, which the leader has as %+v (%v)", a.ID, got, gerr)
		}
	}
	poll.Until(t, 30*time.Second, "the woken leader to follow", func() bool {
		h, err := c.health(old)
		return err == nil && h.Role == arbiter.ReplicaFollower && h.LeaderID == c.nodes[next].id
	})
	before := load.done()
	poll.Until(t, 30*time.Second, "the load to go on", func() bool {
		return load.done() > before+200
	})
	close(keep)
	<-kept
	load.end()
	load.check()
	for _, id := range probes {
		p, err := cl.Allocation(context.Background(), id)
		if err != nil || p.State == arbiter.StateDestroyed {
			t.Errorf("probe %d after the zombie woke: %s %v (reason %v): the zombie wrote", id, p.State, err, p.Reason)
		}
	}
	if !strings.Contains(c.nodes[old].logs.String(), "stepping down") {
		t.Errorf("the woken leader did not say it stepped down")
	}
	if c.leader() != next {
		t.Errorf("the leader changed after the zombie woke")
	}
}

// logTime is the time of the first line of a replica's log (slog's text
// form) whose message is msg, as written there (quoted when it has
// spaces).
func logTime(logs, msg string) (time.Time, bool) {
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line+" ", " msg="+msg+" ") {
			continue
		}
		for _, kv := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(kv, "time="); ok {
				at, err := time.Parse(time.RFC3339Nano, v)
				return at, err == nil
			}
		}
	}
	return time.Time{}, false
}

// TestHACutOffStepsDown: a leader cut off from PostgreSQL (a proxy
// between them stops passing bytes, connections stay open, as a partition
// does) stops leading on its own before its lease could lapse: before any
// other replica leads, and never at the same time.
func TestHACutOffStepsDown(t *testing.T) {
	db := haPostgres(t)
	const target = "127.0.0.1:5432"
	if !strings.Contains(db, target) {
		t.Skip("the test database is not on " + target)
	}
	proxy := tcpproxy.Start(t, target) // stops passing bytes when paused
	viaProxy := strings.Replace(db, target, proxy.Addr, 1)
	c := newHACluster(t, 3, func(i int) string {
		if i == 0 {
			return viaProxy
		}
		return db
	})
	c.startAll() // r0 leads
	if l := c.leader(); l != 0 {
		t.Fatalf("replica %d leads, want r0", l)
	}
	cut := time.Now()
	proxy.Pause()
	next := -1
	poll.Until(t, 30*time.Second, "another replica to lead", func() bool {
		for i := 1; i < len(c.nodes); i++ {
			if h, err := c.health(i); err == nil && h.Role == arbiter.ReplicaLeader {
				next = i
				return true
			}
		}
		return false
	})
	// When each happened is read from the replicas' own logs, written as it
	// happens: health polled from here sees a change only at its next look,
	// and on a busy machine one round of looks at three replicas can take
	// longer than the lease's margin (lease_ttl_s/10) between r0 stepping
	// down and another leading.
	downAt, ok := logTime(c.nodes[0].logs.String(), `"stepping down"`)
	if !ok {
		t.Fatalf("r0 did not log that it stepped down, yet r%d leads", next)
	}
	upAt, ok := logTime(c.nodes[next].logs.String(), "leading")
	if !ok {
		t.Fatalf("r%d leads and did not log it", next)
	}
	down, up := downAt.Sub(cut), upAt.Sub(cut)
	t.Logf("r0 cut off: it stopped leading after %s, r%d led after %s", down.Round(time.Millisecond), next, up.Round(time.Millisecond))
	if down >= haTTL || !downAt.Before(upAt) {
		t.Errorf("r0 stepped down %s after the cut, r%d led after %s: want r0 first, within lease_ttl_s", down, next, up)
	}
	poll.Until(t, 30*time.Second, "the cut-off r0 to answer as a follower", func() bool {
		h, err := c.health(0)
		return err == nil && h.Role == arbiter.ReplicaFollower
	})
	proxy.Resume()
	poll.Until(t, 30*time.Second, "r0 to follow the new leader once the cut heals", func() bool {
		h, err := c.health(0)
		return err == nil && h.Role == arbiter.ReplicaFollower && h.LeaderID != "" && h.LeaderID != "r0"
	})
}

// TestHARefusals: [ha] with SQLite is refused saying why; a second
// process with a node id in use refuses to start, naming the first.
func TestHARefusals(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "secret"), []byte(haSecret), 0o600)
	sqliteConf := "[ha]\nenabled = true\nnode_id = \"a\"\nadvertise_url = \"http://127.0.0.1:1\"\nsecret_file = \"" + filepath.Join(dir, "secret") + "\"\n"
	cfg := filepath.Join(dir, "a.toml")
	os.WriteFile(cfg, []byte(sqliteConf), 0o600)
	_, err := newServerMain(&cli.Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}, []string{"--config", cfg})
	if err == nil || !strings.Contains(err.Error(), "high availability needs PostgreSQL") {
		t.Fatalf("[ha] on SQLite: %v", err)
	}
	db := haPostgres(t)
	conf := sqliteConf + "\n[server]\ndatabase = \"" + db + "\"\n"
	a, err := openServerAt(t, conf, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = openServerAt(t, conf, t.TempDir(), nil)
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), `node_id "a" is in use`) {
		t.Fatalf("a second replica a: %v", err)
	}
	a.Close()
	b, err := openServerAt(t, conf, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("after the first left: %v", err)
	}
	b.Close()
}

// TestHAFailoverTimes is the measurement of the failover, not run in CI:
// ARBITER_HA_RUNS=20 go test -run TestHAFailoverTimes ./cmd/arbiter -v
// kills the leader of three replicas under load that many times and
// reports the takeover times.
func TestHAFailoverTimes(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("ARBITER_HA_RUNS"))
	if runs <= 0 {
		t.Skip("set ARBITER_HA_RUNS to measure")
	}
	db := haPostgres(t)
	c := newHACluster(t, 3, func(int) string { return db })
	c.startAll()
	var took []time.Duration
	for run := range runs {
		load := c.startLoad()
		load.drained = run > 0
		poll.Until(t, 30*time.Second, "load", func() bool { return load.done() > 100 })
		old := c.waitLeader()
		killed := time.Now()
		c.kill(c.nodes[old])
		_, d := c.takeover(old, killed)
		took = append(took, d)
		load.end()
		load.check()
		c.start(old) // back as a follower
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("takeover after SIGKILL, lease_ttl_s %v, %d runs: median %s, max %s, min %s, all %v",
		haTTL.Seconds(), runs, took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), took[0].Round(time.Millisecond), took)
}

// TestHAHandOverInProcess runs two replicas in this process (for the race
// detector): the follower forwards, and when the leader stops (SIGTERM's
// path) it hands the lease over, so the follower leads at once — well
// before the lease would have run out — with the state the leader left.
func TestHAHandOverInProcess(t *testing.T) {
	db := haPostgres(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "secret"), []byte(haSecret), 0o600)
	data := t.TempDir()
	var ms []*serverMain
	var done []chan error
	var cancels []context.CancelFunc
	for i := range 2 {
		port := freePort(t)
		conf := fmt.Sprintf("[server]\ndatabase = %q\n%s\n[ha]\nenabled = true\nnode_id = \"p%d\"\nadvertise_url = \"http://127.0.0.1:%s\"\n"+
			"lease_ttl_s = 30\nsecret_file = %q\n", db, haMachines, i, port, filepath.Join(dir, "secret"))
		m, err := openServerAt(t, conf, data, nil, "--listen", "127.0.0.1:"+port)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ch := make(chan error, 1)
		go func() { ch <- m.Run(ctx) }()
		ms, done, cancels = append(ms, m), append(done, ch), append(cancels, cancel)
		if i == 0 {
			poll.Until(t, 10*time.Second, "p0 to lead", func() bool { _, ok := m.elector.Leading(); return ok })
		}
	}
	follower := client.New(ms[1].cfg.HA.AdvertiseURL, "")
	var a arbiter.Allocation
	poll.Until(t, 10*time.Second, "an allocation through the follower", func() bool {
		var err error
		a, err = follower.Allocate(context.Background(), arbiter.Request{Owner: "x", GPUs: 2})
		return err == nil
	})
	start := time.Now()
	cancels[0]()
	if err := <-done[0]; err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "p1 to lead", func() bool { _, ok := ms[1].elector.Leading(); return ok })
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("p1 led %s after p0 stopped: the lease was not handed over", d)
	}
	got, err := follower.Allocation(context.Background(), a.ID)
	if err != nil || got.State != arbiter.StateReady || len(got.Devices) != 2 {
		t.Fatalf("after the hand-over: %+v %v", got, err)
	}
	if c, err := follower.Cluster(context.Background()); err != nil || c.Role != arbiter.ReplicaLeader || c.Term != 2 {
		t.Fatalf("p1's view: %+v %v", c, err)
	}
	cancels[1]()
	<-done[1]
}

// httpGet is url's body; a failed request or a status other than 200
// fails the test.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := callCtx()
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}
