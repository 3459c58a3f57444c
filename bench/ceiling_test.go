package bench

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The do-nothing servers answer the workloads' requests as the server
// does, so each load tool runs against them without errors.
func TestCeilingServers(t *testing.T) {
	ctx := context.Background()
	sp, err := startCeilingSpalloc()
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	sl := spallocLoad{conns: 2, duration: 100 * time.Millisecond, create: func(i int) string {
		return fmt.Sprintf(`{"command": "create_job", "args": [], "kwargs": {"owner": "t%d"}}`+"\n", i)
	}}
	rep, err := sl.run(ctx, sp.Addr(), io.Discard)
	if err != nil || rep.Cycles == 0 || rep.Errors != 0 {
		t.Errorf("spalloc against the ceiling: %d cycles, %d errors, %v", rep.Cycles, rep.Errors, err)
	}

	h, err := startCeilingHTTP(50)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	al := allocLoad{clients: 2, duration: 100 * time.Millisecond, gpus: 1}
	arep, err := al.run(ctx, h.URL(), "", io.Discard)
	if err != nil || arep.Cycles == 0 || arep.Errors != 0 {
		t.Errorf("alloc against the ceiling: %d cycles, %d errors, %v", arep.Cycles, arep.Errors, err)
	}
	trep := tasksLoad{tasks: 50, workers: 4, payload: 64}.run(ctx, h.URL(), "")
	if trep.Completed != 50 || trep.Errors != 0 {
		t.Errorf("tasks against the ceiling: %d of 50 completed, %d errors %v", trep.Completed, trep.Errors, trep.ErrorSample)
	}
}

// TestCompare: runs alternate between the targets, and the summary is
// each side's median and range and their ratio.
func TestCompare(t *testing.T) {
	var order []string
	rates := map[string][]float64{"ceiling": {100, 300, 200}, "server": {50, 40, 90}}
	cmp, err := compare(context.Background(), "w", "cycles", 3, true, func(_ context.Context, target string) (measured, error) {
		order = append(order, target)
		r := rates[target][0]
		rates[target] = rates[target][1:]
		return measured{Rate: r, P50: 1, P99: r / 10}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ceiling", "server", "ceiling", "server", "ceiling", "server"}; !reflect.DeepEqual(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if c, s := cmp.Ceiling, cmp.Server; c.Rate != 200 || c.RateMin != 100 || c.RateMax != 300 || s.Rate != 50 || s.Runs != 3 {
		t.Errorf("summaries: ceiling %+v, server %+v", c, s)
	}
	if cmp.Ratio != 0.25 || cmp.P99Ratio != 0.25 {
		t.Errorf("ratios %v, %v; want 0.25, 0.25", cmp.Ratio, cmp.P99Ratio)
	}
	var b strings.Builder
	if err := printComparison(&b, cmp); err != nil || !strings.Contains(b.String(), "server / ceiling: 0.25") {
		t.Errorf("printed:\n%s", b.String())
	}
	if med, _, _ := medianRange([]float64{4, 1, 3, 2}); med != 2.5 {
		t.Errorf("median of four: %v, want 2.5", med)
	}
}
