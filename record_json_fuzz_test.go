package arbiter

import (
	"encoding/json"
	"testing"
)

// FuzzRecordJSON: an allocation or a task as a store hands it back (any
// JSON). What decodes is written by AppendJSON exactly as encoding/json's
// reflection writes it, the result is JSON, and it decodes to a value
// that is written the same again (decode and encode are a fixed point).
func FuzzRecordJSON(f *testing.F) {
	kas := 60.0
	for _, a := range []Allocation{
		{ID: 1, State: StateReady, Devices: []DeviceRef{{}}, Request: Request{Owner: "a", GPUs: 2, KeepaliveS: &kas}},
		{ID: 2, State: StateQueued, Request: Request{Owner: "b", Grid: &GridRequest{Form: GridBlock, Width: 2, Height: 1, Args: []int{2, 1}, Kwargs: json.RawMessage(`{"owner":"b"}`)}}},
	} {
		b, _ := json.Marshal(a)
		f.Add(b, false)
	}
	f.Add([]byte(`{"id":3,"request":{"owner":"\u2028\ud800","grid":{"args":[1,2,3],"min_ratio":1e-7,"kwargs":{ "a" : 1 }}},"created_at":"2026-01-02T03:04:05.123456789+05:30"}`), false)
	f.Add([]byte(`{"request":{"grid":{"args":[5]}}, "gpus":[], "tags":null}`), false)
	tk := Task{ID: "x", Status: "queued", Spec: &TaskSpec{Model: "m", Command: []string{"a", "b"}}}
	b, _ := json.Marshal(tk)
	f.Add(b, true)
	f.Add([]byte(`{"id":"x","spec":{"command":["a"],"hyper":{"k":[1,{"y":null}]},"env":{"A":"\u003c"}},"result":{"a":1e400}}`), true)
	f.Fuzz(func(t *testing.T, data []byte, task bool) {
		if task {
			var v Task
			if json.Unmarshal(data, &v) != nil {
				return
			}
			got := v.AppendJSON(nil)
			want, err := json.Marshal(plainTask(&v))
			if err != nil {
				t.Fatalf("reflection: %v", err)
			}
			if string(got) != string(want) {
				t.Fatalf("task from %q:\ngot  %s\nwant %s", data, got, want)
			}
			var back Task
			if err := json.Unmarshal(got, &back); err != nil {
				t.Fatalf("task %s does not read back: %v", got, err)
			}
			if again := back.AppendJSON(nil); string(again) != string(got) {
				t.Fatalf("task from %q:\nfirst  %s\nsecond %s", data, got, again)
			}
			return
		}
		var v Allocation
		if json.Unmarshal(data, &v) != nil {
			return
		}
		got := v.AppendJSON(nil)
		if want := reflectJSON(t, &v); string(got) != string(want) {
			t.Fatalf("allocation from %q:\ngot  %s\nwant %s", data, got, want)
		}
		var back Allocation
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("allocation %s does not read back: %v", got, err)
		}
		if again := back.AppendJSON(nil); string(again) != string(got) {
			t.Fatalf("allocation from %q:\nfirst  %s\nsecond %s", data, got, again)
		}
	})
}
