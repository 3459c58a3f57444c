package httpapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/ui"
)

// uiBenchPlane is a read-only plane as the real read view answers: fixed
// machines of 8 GPUs, three quarters of them held in allocations of 2, 10%
// more allocations waiting, 200 ended, 50 events.
type uiBenchPlane struct {
	fakePlane
	ms []arbiter.MachineStatus
	as []arbiter.Allocation
}

func newUIBenchPlane(machines int) *uiBenchPlane {
	p := &uiBenchPlane{fakePlane: *newFakePlane()}
	id := int64(1)
	ka := 60.0
	exp := fakeNow.Add(30 * time.Second)
	for m := 0; m < machines; m++ {
		name := fmt.Sprintf("gpu%04d", m)
		st := arbiter.MachineStatus{Name: name, Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, State: arbiter.MachineUp, LastSeen: &fakeNow, Tags: []string{"h100"}}
		for g := 0; g < 8; g++ {
			st.Devices = append(st.Devices, arbiter.DeviceStatus{Index: g, Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80, Compute: "9.0", Healthy: true})
		}
		st.Free = 8
		for g := 0; g < 6; g += 2 {
			a := arbiter.Allocation{ID: id, Owner: fmt.Sprintf("user%d", id%23), State: arbiter.StateReady,
				Machine: arbiter.Str(name), Devices: []arbiter.DeviceRef{{Machine: name, Index: g}, {Machine: name, Index: g + 1}},
				CreatedAt: fakeNow, ReadyAt: &fakeNow, KeepaliveS: &ka, ExpiresAt: &exp}
			p.as = append(p.as, a)
			for _, d := range []int{g, g + 1} {
				aid, owner := a.ID, a.Owner
				st.Devices[d].Allocation, st.Devices[d].Owner, st.Devices[d].Since = &aid, &owner, &fakeNow
				st.Free--
			}
			id++
		}
		p.ms = append(p.ms, st)
	}
	for q := 0; q < machines*3/10; q++ {
		p.as = append(p.as, arbiter.Allocation{ID: id, Owner: "waiter", State: arbiter.StateQueued, Request: arbiter.Request{GPUs: 4},
			CreatedAt: fakeNow, WhyQueued: arbiter.Str("waiting for 4 free GPUs")})
		id++
	}
	for d := 0; d < 200; d++ {
		p.as = append(p.as, arbiter.Allocation{ID: id, Owner: "done", State: arbiter.StateDestroyed, Reason: arbiter.Str("released"),
			CreatedAt: fakeNow, DestroyedAt: &fakeNow})
		id++
	}
	for e := 0; e < 50; e++ {
		p.emitLocked(arbiter.EventAllocationReady, p.as[e])
	}
	return p
}

func (p *uiBenchPlane) Machines() []arbiter.MachineStatus {
	return append([]arbiter.MachineStatus(nil), p.ms...)
}

func (p *uiBenchPlane) Allocations(f arbiter.AllocationFilter) []arbiter.Allocation {
	out := make([]arbiter.Allocation, 0, len(p.as))
	for i := range p.as {
		if f.Match(&p.as[i]) {
			out = append(out, p.as[i])
		}
	}
	return out
}

// BenchmarkUIPage renders the whole page; BenchmarkUIPanels what the page
// fetches after an allocation event (every panel but locks and schedules);
// BenchmarkUIPanel each panel alone for a fleet of 1,000 hosts (the
// machines panel as compact rows, ui.CompactAt); BenchmarkUIPanelTiles
// the machines panel of the largest fleet still shown as tiles.
func BenchmarkUIPage(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			uiBenchServe(b, newUIBenchPlane(n), "/")
		})
	}
}

func BenchmarkUIPanels(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			uiBenchServe(b, newUIBenchPlane(n), "/ui/panels?p=summary&p=machines&p=queue&p=live&p=pools&p=history&p=events")
		})
	}
}

func BenchmarkUIPanel(b *testing.B) {
	p := newUIBenchPlane(1000)
	for _, name := range []string{"summary", "machines", "queue", "live", "history", "events"} {
		b.Run(name, func(b *testing.B) { uiBenchServe(b, p, "/ui/panels?p="+name) })
	}
}

func BenchmarkUIPanelTiles(b *testing.B) {
	uiBenchServe(b, newUIBenchPlane(ui.CompactAt), "/ui/panels?p=machines")
}

// uiBenchServe serves path from a server on p, as a user, b.N times.
func uiBenchServe(b *testing.B, p *uiBenchPlane, path string) {
	s := NewServer(Options{Plane: p, Tokens: testTokens})
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, uiBenchRequest(path))
		if w.Code != 200 {
			b.Fatal(w.Code)
		}
		b.SetBytes(int64(w.Body.Len()))
	}
}

func uiBenchRequest(path string) *http.Request {
	r := testRequest("GET", path, nil)
	r.Header.Set("Authorization", "Bearer "+testUser)
	return r
}

// uiBigGrid is a w × h-triad grid machine whose boards are held, a block
// of 2 × 2 triads by each allocation, by every other block.
func uiBigGrid(w, h int) (arbiter.MachineStatus, []arbiter.Allocation) {
	m := arbiter.MachineStatus{Name: "spinn1m", Kind: arbiter.KindGrid, State: arbiter.MachineUp, Grid: &arbiter.GridInfo{Width: w, Height: h}}
	var as []arbiter.Allocation
	on := true
	for x := 0; x < w; x++ {
		for y := 0; y < h; y++ {
			for z := 0; z < 3; z++ {
				d := arbiter.DeviceStatus{Index: (x*h+y)*3 + z, Model: "board", Healthy: true,
					Board: &arbiter.BoardDevice{X: x, Y: y, Z: z, Cabinet: x / 5, Frame: y / 5, Slot: z, IP: "10.2.0.1"}}
				if block := (x/2)*(h/2) + y/2; block%2 == 0 {
					id := int64(block + 1)
					owner := "user" + strconv.Itoa(block%11)
					d.Allocation, d.Owner = &id, &owner
				}
				m.Devices = append(m.Devices, d)
			}
		}
	}
	for b := 0; b < (w/2)*(h/2); b += 2 {
		as = append(as, arbiter.Allocation{ID: int64(b + 1), Owner: "user" + strconv.Itoa(b%11), State: arbiter.StateReady, Power: &on})
	}
	return m, as
}

// BenchmarkUIBoardMap renders the machines panel of a 1,200-board machine
// (20 × 20 triads), half of it held by 50 allocations.
func BenchmarkUIBoardMap(b *testing.B) {
	m, as := uiBigGrid(20, 20)
	p := &uiBenchPlane{fakePlane: *newFakePlane(), ms: []arbiter.MachineStatus{m}, as: as}
	uiBenchServe(b, p, "/ui/panels?p=machines")
}
