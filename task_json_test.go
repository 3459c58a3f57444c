package arbiter

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// TestTaskJSON holds Task.AppendJSON to encoding/json's reflection over
// the struct tags, for tasks whose every field (found by reflection, so a
// field added later is covered) is filled at random.
func TestTaskJSON(t *testing.T) {
	holdToReflection(t, 3, (*Task).AppendJSON, func(tk *Task) []byte {
		b, err := json.Marshal(plainTask(tk))
		if err != nil {
			t.Fatalf("reflection: %v", err)
		}
		return b
	})
}

// plainTask is tk as the same structs without their methods, for
// encoding/json to write by reflection.
func plainTask(tk *Task) any {
	type plainSpec TaskSpec
	tt := reflect.TypeFor[Task]()
	var fields []reflect.StructField
	for i := 0; i < tt.NumField(); i++ {
		f := tt.Field(i)
		if f.Name == "Spec" {
			f.Type = reflect.TypeFor[*plainSpec]()
		}
		fields = append(fields, f)
	}
	p := reflect.New(reflect.StructOf(fields)).Elem()
	tv := reflect.ValueOf(tk).Elem()
	for i := range fields {
		if fields[i].Name == "Spec" {
			if tk.Spec != nil {
				p.Field(i).Set(reflect.ValueOf((*plainSpec)(tk.Spec)))
			}
		} else {
			p.Field(i).Set(tv.Field(i))
		}
	}
	return p.Interface()
}

// FuzzRawJSON holds appendRawJSON to encoding/json's writing of a
// json.RawMessage: the same bytes where it succeeds, null where it fails.
func FuzzRawJSON(f *testing.F) {
	for _, s := range []string{`{}`, `{"a" : [1, 2 , {"b":null}]}`, `{"k":"<a&b>"}`, "{\"k\":\"\u2028\"}", ` "x" `, `{`, ``, `nul`, `[1e400]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got := appendRawJSON([]byte("x"), raw)
		want, err := json.Marshal(json.RawMessage(raw))
		if err != nil || len(raw) == 0 {
			want = []byte("null")
		}
		if string(got) != "x"+string(want) {
			t.Fatalf("%q:\ngot  %s\nwant x%s", raw, got, want)
		}
	})
}

func BenchmarkTaskJSON(b *testing.B) {
	now := time.Now()
	tk := Task{ID: "0024810f8555512a065d5ccb64102888b26efa41c80d3616f34b385957465433", Name: "bench-r1-0024810f",
		Spec: &TaskSpec{Model: "bench", Mode: "r1", Hyper: json.RawMessage(`{}`), TrainHosts: []string{}, Seed: 737,
			AllowedHosts: []string{}, Command: []string{"true"}, MaxAttempts: 1, StaleAfterS: 600},
		Status: TaskCompleted, Attempts: 1, ClaimedBy: "bench-w29", ClaimedAt: &now, HeartbeatAt: &now, CompletedAt: &now,
		ArtifactID: "fb73bc73f6134e66993baf672d0bdd31d69e9159321957bb6fcad33873ad1e85", GPUs: []int{}, CreatedAt: now, UpdatedAt: now,
		Seq: 738, InManifest: true}
	b.Run("append", func(b *testing.B) {
		buf := make([]byte, 0, 2048)
		for b.Loop() {
			buf = tk.AppendJSON(buf[:0])
		}
	})
	b.Run("reflection", func(b *testing.B) {
		p := plainTask(&tk)
		for b.Loop() {
			json.Marshal(p)
		}
	})
}
