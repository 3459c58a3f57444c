package spalloc

import "testing"

// BenchmarkHandle measures the protocol path of one request (decode, bind,
// backend call on the in-memory fake, encode) for the commands of a
// create/state/destroy cycle.
func BenchmarkHandle(b *testing.B) {
	be := newFakeBackend(machine4x2())
	s := NewSession("10.0.0.9")
	if _, err := s.Handle(be, []byte(`{"command": "create_job", "args": [], "kwargs": {"owner": "bench", "keepalive": 60.0}}`)); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, line string }{
		{"get_job_state", `{"command": "get_job_state", "args": [1], "kwargs": {}}`},
		{"create_job", `{"command": "create_job", "args": [], "kwargs": {"owner": "bench", "keepalive": 60.0, "machine": null, "tags": null, "min_ratio": 0.333, "max_dead_boards": 0, "max_dead_links": null, "require_torus": false}}`},
		{"destroy_job", `{"command": "destroy_job", "args": [999999, "done"], "kwargs": {}}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			line := []byte(bc.line)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if bc.name == "create_job" && i%20 == 0 {
					be = newFakeBackend(machine4x2()) // keep the fake small
				}
				if _, err := s.Handle(be, line); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
