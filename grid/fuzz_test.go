package grid

import (
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// FuzzAllocator runs operations decoded from arbitrary bytes (a machine,
// then requests of every form and frees) and checks the allocator's
// invariants after each.
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{3, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 200, 201, 13})
	f.Add([]byte{8, 8, 7, 1, 1, 2, 2, 9, 9, 130, 40, 41, 42, 255, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 3 {
			return
		}
		w, h := 1+int(data[0])%8, 1+int(data[1])%8
		var dead []arbiter.Board
		var links []arbiter.BoardLink
		for i := 0; i < int(data[2])%6; i++ {
			dead = append(dead, bd(i%w, (i*7)%h, i%3))
			links = append(links, arbiter.BoardLink{Board: bd((i*3)%w, i%h, (i+1)%3), Link: arbiter.Link(i % 6)})
		}
		a, err := NewAllocator(w, h, dead, links)
		if err != nil {
			t.Fatal(err)
		}
		isDead := map[arbiter.Board]bool{}
		for _, d := range dead {
			isDead[d] = true
		}
		live := map[int64]bool{}
		next := int64(1)
		for i := 3; i+2 < len(data); i += 3 {
			op, p, q := data[i], int(data[i+1]), int(data[i+2])
			var r arbiter.GridRequest
			switch op % 5 {
			case 0:
				r = arbiter.GridRequest{}
			case 1:
				r = arbiter.GridRequest{Form: arbiter.GridBoards, Boards: p%(3*w*h+2) - 1, MinRatio: float64(q%4) / 3}
			case 2:
				r = arbiter.GridRequest{Form: arbiter.GridBlock, Width: p%(w+1) + 0, Height: q%(h+1) + 0, RequireTorus: op&0x80 != 0}
			case 3:
				r = arbiter.GridRequest{Form: arbiter.GridBoard, Board: bd(p%(w+1), q%(h+1), int(op>>4)%4)}
			case 4:
				for id := range live {
					if int(id)%3 == p%3 {
						if !a.Free(id) {
							t.Fatalf("free %d failed", id)
						}
						delete(live, id)
						break
					}
				}
				continue
			}
			if op&0x40 != 0 && (r.Form == arbiter.GridBoards || r.Form == arbiter.GridBlock) {
				n := q % 3
				r.MaxDeadBoards, r.MaxDeadLinks = &n, &n
			}
			before := snapshot(a)
			if pl := a.Allocate(next, &r); pl != nil {
				live[next] = true
			} else if snapshot(a) != before {
				t.Fatalf("refused %+v changed the state", r)
			}
			next++
			checkInvariants(t, a, live, isDead)
		}
	})
}
