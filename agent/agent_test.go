package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/gpu"
	"github.com/arbiter-hq/arbiter/poll"
)

// fakeServer is an in-memory Server. Its failure knobs make the next calls
// fail the way the real client does.
type fakeServer struct {
	mu         sync.Mutex
	machines   map[string]arbiter.Machine
	registers  []arbiter.Machine // every successful registration, in order
	heartbeats int
	attempts   int   // every call, failed or not
	down       int   // fail this many more calls with a transport error
	refuse     error // fail every call with this error
}

func newFakeServer() *fakeServer {
	return &fakeServer{machines: make(map[string]arbiter.Machine)}
}

var errConnRefused = errors.New("dial tcp 127.0.0.1:7070: connect: connection refused")

func (s *fakeServer) fail() error {
	s.attempts++
	if s.refuse != nil {
		return s.refuse
	}
	if s.down > 0 {
		s.down--
		return errConnRefused
	}
	return nil
}

func (s *fakeServer) RegisterMachine(_ context.Context, m arbiter.Machine) (arbiter.MachineStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail(); err != nil {
		return arbiter.MachineStatus{}, err
	}
	s.machines[m.Name] = m
	s.registers = append(s.registers, m)
	return arbiter.MachineStatus{Name: m.Name, State: arbiter.MachineUp}, nil
}

func (s *fakeServer) Heartbeat(_ context.Context, name string) (arbiter.MachineStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail(); err != nil {
		return arbiter.MachineStatus{}, err
	}
	if _, ok := s.machines[name]; !ok {
		return arbiter.MachineStatus{}, arbiter.Errorf(arbiter.ENotFound, "machine %q not found", name)
	}
	s.heartbeats++
	return arbiter.MachineStatus{Name: name, State: arbiter.MachineUp}, nil
}

// snapshot returns copies of the counters under the lock.
func (s *fakeServer) snapshot() (registers []arbiter.Machine, heartbeats, attempts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]arbiter.Machine(nil), s.registers...), s.heartbeats, s.attempts
}

// fakeNvidiaSMI puts ../gpu/testdata/fake-nvidia-smi on PATH as nvidia-smi,
// printing fixture.
func fakeNvidiaSMI(t testing.TB, fixture string) {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "gpu", "testdata", "fake-nvidia-smi"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(script, filepath.Join(dir, "nvidia-smi")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_NVIDIA_SMI", fixture)
}

// start runs the agent and returns a function that cancels it and returns
// what Run returned.
func start(t *testing.T, cfg Config) (stop func() error) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, cfg) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// fast are intervals short enough for tests.
func fast(s Server) Config {
	return Config{
		Server:            s,
		HeartbeatInterval: 2 * time.Millisecond,
		RedetectInterval:  time.Hour,
		MinBackoff:        time.Millisecond,
		MaxBackoff:        4 * time.Millisecond,
		GPU:               gpu.Options{DisableNVML: true},
	}
}

func TestRunRegistersAndHeartbeats(t *testing.T) {
	fakeNvidiaSMI(t, "h100x8")
	s := newFakeServer()
	cfg := fast(s)
	cfg.Tags = []string{"default", "h100"}
	stop := start(t, cfg)

	poll.Until(t, 10*time.Second, "3 heartbeats", func() bool { _, hb, _ := s.snapshot(); return hb >= 3 })
	if err := stop(); err != nil {
		t.Fatalf("Run: got %v, want nil after cancel", err)
	}
	regs, _, _ := s.snapshot()
	if len(regs) != 1 {
		t.Fatalf("got %d registrations, want 1", len(regs))
	}
	m := regs[0]
	host, _ := os.Hostname()
	if m.Name != host || m.Kind != arbiter.KindGPU || m.Source != arbiter.SourceAgent {
		t.Errorf("got name %q kind %q source %q, want %q gpu agent", m.Name, m.Kind, m.Source, host)
	}
	if len(m.GPUs) != 8 || m.GPUs[7].Model != "NVIDIA H100 80GB HBM3" || m.GPUs[7].VRAMGiB != 79.65 {
		t.Errorf("got GPUs %+v, want the 8 H100s of the fixture", m.GPUs)
	}
	if m.CUDA != "12.4" || m.Driver != "550.54.15" {
		t.Errorf("got cuda %q driver %q, want 12.4 550.54.15", m.CUDA, m.Driver)
	}
	if strings.Join(m.Tags, ",") != "default,h100" || m.Cores < 1 {
		t.Errorf("got tags %v cores %d, want [default h100] and cores", m.Tags, m.Cores)
	}
}

func TestRunReregistersAfterNotFound(t *testing.T) {
	fakeNvidiaSMI(t, "mixed")
	s := newFakeServer()
	cfg := fast(s)
	cfg.Name = "gpu7"
	start(t, cfg)

	poll.Until(t, 10*time.Second, "a heartbeat", func() bool { _, hb, _ := s.snapshot(); return hb >= 1 })
	s.mu.Lock()
	s.machines = make(map[string]arbiter.Machine) // the server restarted on a new database
	s.mu.Unlock()
	poll.Until(t, 10*time.Second, "a second registration", func() bool { regs, _, _ := s.snapshot(); return len(regs) >= 2 })
	regs, _, _ := s.snapshot()
	if regs[1].Name != "gpu7" || len(regs[1].GPUs) != 3 {
		t.Errorf("got re-registration %q with %d GPUs, want gpu7 with 3", regs[1].Name, len(regs[1].GPUs))
	}
}

func TestRunRetriesWhileServerDown(t *testing.T) {
	fakeNvidiaSMI(t, "gb10")
	s := newFakeServer()
	s.down = 6 // registration fails six times, then the server is back
	start(t, fast(s))

	poll.Until(t, 10*time.Second, "registration once the server is back", func() bool { regs, _, _ := s.snapshot(); return len(regs) == 1 })
	_, _, attempts := s.snapshot()
	if attempts < 7 {
		t.Errorf("got %d attempts, want at least 7 (6 failures, then success)", attempts)
	}

	// The server goes down again after registration: heartbeats retry too.
	s.mu.Lock()
	s.down, s.heartbeats = 3, 0
	s.mu.Unlock()
	poll.Until(t, 10*time.Second, "heartbeats once the server is back", func() bool { _, hb, _ := s.snapshot(); return hb >= 2 })
	regs, _, _ := s.snapshot()
	if len(regs) != 1 {
		t.Errorf("got %d registrations, want 1 (a transport error is not not_found)", len(regs))
	}
}

func TestRunFatal(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"unauthorized", arbiter.Errorf(arbiter.EUnauthorized, "no valid token"), "agent role"},
		{"forbidden", arbiter.Errorf(arbiter.EForbidden, "token lacks the agent role"), "agent role"},
		{"invalid", arbiter.Errorf(arbiter.EInvalid, "machine \"x\": bad"), "bad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFakeServer()
			s.refuse = tt.err
			cfg := fast(s)
			cfg.Detect = func(context.Context) (gpu.Host, error) { return gpu.Host{Hostname: "h1", Cores: 4}, nil }
			err := Run(context.Background(), cfg)
			if arbiter.ErrorCode(err) != arbiter.ErrorCode(tt.err) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want code %s mentioning %q", err, arbiter.ErrorCode(tt.err), tt.want)
			}
		})
	}
}

func TestRunReregistersWhenGPUsChange(t *testing.T) {
	fakeNvidiaSMI(t, "h100x8")
	s := newFakeServer()
	cfg := fast(s)
	cfg.RedetectInterval = 3 * time.Millisecond
	start(t, cfg)

	poll.Until(t, 10*time.Second, "a heartbeat", func() bool { _, hb, _ := s.snapshot(); return hb >= 1 })
	regs, _, _ := s.snapshot()
	if len(regs) != 1 {
		t.Fatalf("got %d registrations before the change, want 1 (an unchanged host is not re-registered)", len(regs))
	}
	// A GPU falls off the bus; the next detection sees it.
	os.Setenv("FAKE_NVIDIA_SMI", "fallen-off-bus") // restored by the t.Setenv above
	// (A detection straddling the switch may register a mix first.)
	poll.Until(t, 10*time.Second, "a re-registration with 4 GPUs", func() bool {
		regs, _, _ := s.snapshot()
		return len(regs[len(regs)-1].GPUs) == 4
	})
	regs, _, _ = s.snapshot()
	m := regs[len(regs)-1]
	if g := m.GPUs; g[2].Healthy || !g[3].Healthy || m.CUDA != "12.4" {
		t.Errorf("got GPUs %+v cuda %q, want GPU 2 unhealthy and cuda 12.4", g, m.CUDA)
	}
}

func TestRunKeepsMachineWhenRedetectFails(t *testing.T) {
	s := newFakeServer()
	cfg := fast(s)
	cfg.RedetectInterval = time.Millisecond
	var mu sync.Mutex
	detects := 0
	cfg.Detect = func(context.Context) (gpu.Host, error) {
		mu.Lock()
		defer mu.Unlock()
		detects++
		if detects == 1 {
			return gpu.Host{Hostname: "h1", Cores: 4, GPUs: []arbiter.GPU{{Index: 0, UUID: "GPU-a", Model: "Tesla T4", VRAMGiB: 15, Compute: "7.5", Healthy: true}}}, nil
		}
		return gpu.Host{}, errors.New("nvidia-smi: signal: killed")
	}
	start(t, cfg)
	poll.Until(t, 10*time.Second, "failed re-detections", func() bool { mu.Lock(); defer mu.Unlock(); return detects >= 4 })
	poll.Until(t, 10*time.Second, "a heartbeat", func() bool { _, hb, _ := s.snapshot(); return hb >= 1 })
	regs, _, _ := s.snapshot()
	if len(regs) != 1 || len(regs[0].GPUs) != 1 {
		t.Errorf("got %d registrations, want 1 with the GPU kept", len(regs))
	}
}

func TestRunRefusesBadStart(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		detect error
		want   string
	}{
		{"no server", Config{}, nil, "no server"},
		{"bad name", Config{Server: newFakeServer(), Name: "-bad name"}, nil, "--name"},
		{"bad tag", Config{Server: newFakeServer(), Tags: []string{"a,b"}}, nil, "tag"},
		{"detect fails", Config{Server: newFakeServer()}, errors.New("nvidia-smi failed"), "detect host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Detect = func(context.Context) (gpu.Host, error) { return gpu.Host{Hostname: "h1"}, tt.detect }
			err := Run(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestRunCancelledDuringBackoff(t *testing.T) {
	s := newFakeServer()
	s.down = 1 << 30
	cfg := fast(s)
	cfg.MinBackoff, cfg.MaxBackoff = time.Hour, time.Hour // parked in backoff
	cfg.Detect = func(context.Context) (gpu.Host, error) { return gpu.Host{Hostname: "h1"}, nil }
	stop := start(t, cfg)
	poll.Until(t, 10*time.Second, "a failed attempt", func() bool { _, _, n := s.snapshot(); return n >= 1 })
	if err := stop(); err != nil {
		t.Errorf("got %v, want nil after cancel", err)
	}
}

func TestBackoff(t *testing.T) {
	a := &agent{cfg: Config{MinBackoff: time.Second, MaxBackoff: 30 * time.Second}, backoff: time.Second}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i, w := range want {
		w *= time.Second
		got := a.nextBackoff()
		if got > w || got < w-w/5 {
			t.Errorf("retry %d: got %v, want %v less up to 20%% jitter", i, got, w)
		}
	}
}
