package control

import (
	"encoding/json"
	"runtime"
	"sync"

	"github.com/arbiter-hq/arbiter"
)

// decodeTasks decodes the stored JSON of the task records of a loaded
// state on every core, replacing each value by its *arbiter.Task, before
// the engine takes them: tasks are most of a large state (100,000 make
// three quarters of a start's work), and the engine, pure, decodes on one.
// A record that does not decode is left as it was: the engine reports it.
func decodeTasks(recs []arbiter.Record) {
	var idx []int
	for i := range recs {
		if _, ok := recs[i].Value.(json.RawMessage); ok && recs[i].Kind == arbiter.KindTask {
			idx = append(idx, i)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(idx)/1000+1)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := w; k < len(idx); k += workers {
				r := &recs[idx[k]]
				t := new(arbiter.Task)
				if json.Unmarshal(r.Value.(json.RawMessage), t) == nil {
					r.Value = t
				}
			}
		}()
	}
	wg.Wait()
}
