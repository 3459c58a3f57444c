package arbiter_test

import (
	"encoding/json"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func TestEventSummary(t *testing.T) {
	note := "swapping to gemma"
	m := "gpu1"
	for _, tc := range []struct {
		kind string
		data any
		want string
	}{
		{arbiter.EventAllocationReady, arbiter.Allocation{Owner: "alice", Machine: &m, Devices: []arbiter.DeviceRef{{Machine: "gpu1", Index: 0}, {Machine: "gpu1", Index: 1}, {Machine: "gpu1", Index: 2}}}, "alice · gpu1: 0–2"},
		{arbiter.EventAllocationDestroyed, arbiter.Allocation{Owner: arbiter.TaskOwnerPrefix + "0123456789abcdef0123", Reason: arbiter.Str("released")}, "task:0123456789ab · released"},
		{arbiter.EventAllocationQueued, arbiter.Allocation{Owner: "bob", Request: arbiter.Request{GPUs: 1}, WhyQueued: arbiter.Str("waiting")}, "bob · 1 GPU · waiting"},
		{arbiter.EventLockAcquired, arbiter.LockEvent{LockState: arbiter.LockState{Name: "swap", Held: true, Holder: "ci", Note: &note}}, "held by ci · swapping to gemma"},
		{arbiter.EventSwapComplete, arbiter.Swap{Service: "vllm", ModelKey: "gemma", State: "complete", RequestedBy: "ops"}, "vllm · gemma · complete · by ops"},
		{arbiter.EventTaskFailed, arbiter.Task{Name: "gbt/realistic", Status: "failed", ClaimedBy: "w1", Attempts: 3, LastError: "exit 1\nTraceback"}, "gbt/realistic · failed · on w1 · attempt 3 · exit 1 …"},
		{arbiter.EventWebhookCreated, arbiter.Webhook{ID: "chat", URL: "https://example.com/hook", Enabled: true}, "https://example.com/hook"},
		{arbiter.EventMachineDown, arbiter.Machine{Name: "gpu1", Down: true, GPUs: make([]arbiter.GPU, 8)}, "down · 8 GPUs"},
	} {
		raw, _ := json.Marshal(tc.data)
		if got := arbiter.EventSummary(arbiter.Event{Kind: tc.kind, Data: raw}); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.kind, got, tc.want)
		}
	}
	if got := arbiter.EventSummary(arbiter.Event{Kind: "lock.acquired", Data: []byte("not json")}); got != "" {
		t.Errorf("unreadable data: got %q, want nothing", got)
	}
}
