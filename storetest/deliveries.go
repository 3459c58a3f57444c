package storetest

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// ExerciseDeliveries runs the conformance suite of the webhook delivery log
// (arbiter.DeliveryLog) on the stores newStore gives; every store must
// implement it beside arbiter.Store. A store package runs it next to
// Exercise, with the same Opener.
func ExerciseDeliveries(t *testing.T, newStore Opener) {
	cases := []struct {
		name string
		run  func(t *testing.T, open func() arbiter.DeliveryLog)
	}{
		{"Empty", testDeliveriesEmpty},
		{"Enqueue", testDeliveriesEnqueue},
		{"Attempts", testDeliveriesAttempts},
		{"List", testDeliveriesList},
		{"Trim", testDeliveriesTrim},
		{"Atomic", testDeliveriesAtomic},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			open := newStore(t)
			var prev arbiter.Store
			c.run(t, func() arbiter.DeliveryLog {
				// One handle at a time: a store is one server's
				// (a second Open of it is refused while the first is open).
				if prev != nil {
					prev.Close()
				}
				s := open()
				prev = s
				t.Cleanup(func() { s.Close() })
				dl, ok := s.(arbiter.DeliveryLog)
				if !ok {
					t.Fatalf("%T does not implement arbiter.DeliveryLog", s)
				}
				return dl
			})
		})
	}
}

// reopenLog closes dl and opens the same store again: a store may refuse a
// second handle on its data while one is open.
func reopenLog(t *testing.T, dl arbiter.DeliveryLog, open func() arbiter.DeliveryLog) arbiter.DeliveryLog {
	t.Helper()
	if err := dl.(arbiter.Store).Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return open()
}

// Delivery times are kept to the microsecond (PostgreSQL's precision).
var (
	dt0 = t0.Truncate(time.Microsecond)
	dt1 = t1.Truncate(time.Microsecond)
	dt2 = t2.Truncate(time.Microsecond)
)

func delivery(seq int64, hook string, next time.Time) arbiter.Delivery {
	n := next
	return arbiter.Delivery{
		ID: "msg_" + itoa(seq) + "_" + hook, Webhook: hook, EventSeq: seq, EventKind: "swap.complete",
		Body: []byte(`{"seq":` + itoa(seq) + `}`), State: arbiter.DeliveryPending, NextAttemptAt: &n,
		CreatedAt: dt0, UpdatedAt: dt0,
	}
}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func cursor(t *testing.T, dl arbiter.DeliveryLog) int64 {
	t.Helper()
	c, err := dl.WebhookCursor(ctxT(t))
	if err != nil {
		t.Fatalf("WebhookCursor: %v", err)
	}
	return c
}

func pending(t *testing.T, dl arbiter.DeliveryLog, limit int) []arbiter.Delivery {
	t.Helper()
	ds, err := dl.PendingDeliveries(ctxT(t), limit, nil)
	if err != nil {
		t.Fatalf("PendingDeliveries: %v", err)
	}
	return ds
}

func ids(ds []arbiter.Delivery) []string {
	out := []string{}
	for _, d := range ds {
		out = append(out, d.ID)
	}
	return out
}

func list(t *testing.T, dl arbiter.DeliveryLog, f arbiter.DeliveryFilter) []arbiter.Delivery {
	t.Helper()
	ds, err := dl.Deliveries(ctxT(t), f)
	if err != nil {
		t.Fatalf("Deliveries: %v", err)
	}
	return ds
}

func testDeliveriesEmpty(t *testing.T, open func() arbiter.DeliveryLog) {
	dl := open()
	if c := cursor(t, dl); c != 0 {
		t.Errorf("cursor: got %d, want 0", c)
	}
	if ds := pending(t, dl, 10); len(ds) != 0 {
		t.Errorf("pending: got %v, want none", ids(ds))
	}
	if ds := list(t, dl, arbiter.DeliveryFilter{}); ds == nil || len(ds) != 0 {
		t.Errorf("list: got %v, want an empty list", ds)
	}
	if err := dl.TrimDeliveries(ctxT(t), 0); err != nil {
		t.Errorf("trim empty: %v", err)
	}
}

func testDeliveriesEnqueue(t *testing.T, open func() arbiter.DeliveryLog) {
	dl := open()
	ds := []arbiter.Delivery{delivery(3, "wh1", dt1), delivery(3, "wh2", dt0), delivery(4, "wh1", dt2)}
	if err := dl.EnqueueDeliveries(ctxT(t), ds, 5); err != nil {
		t.Fatal(err)
	}
	// Again, changed: ids present are kept as they are; the cursor never
	// moves back; an enqueue of nothing moves it forward.
	again := delivery(3, "wh1", dt2)
	again.Body = []byte(`{"changed":true}`)
	if err := dl.EnqueueDeliveries(ctxT(t), []arbiter.Delivery{again}, 4); err != nil {
		t.Fatal(err)
	}
	if c := cursor(t, dl); c != 5 {
		t.Errorf("cursor after a lower one: got %d, want 5", c)
	}
	if err := dl.EnqueueDeliveries(ctxT(t), nil, 9); err != nil {
		t.Fatal(err)
	}
	dl = reopenLog(t, dl, open) // persisted
	if c := cursor(t, dl); c != 9 {
		t.Errorf("cursor: got %d, want 9", c)
	}
	got := pending(t, dl, 10)
	if want := []string{"msg_3_wh2", "msg_3_wh1", "msg_4_wh1"}; !reflect.DeepEqual(ids(got), want) {
		t.Fatalf("pending order: got %v, want %v (earliest next attempt first)", ids(got), want)
	}
	d := got[1]
	if string(d.Body) != `{"seq":3}` || d.EventSeq != 3 || d.EventKind != "swap.complete" || d.State != arbiter.DeliveryPending ||
		d.NextAttemptAt == nil || !d.NextAttemptAt.Equal(dt1) || !d.CreatedAt.Equal(dt0) {
		t.Errorf("delivery: got %+v body %s", d, d.Body)
	}
	if got := pending(t, dl, 2); len(got) != 2 {
		t.Errorf("limit 2: got %d", len(got))
	}
	// Leaving subscriptions out of the read.
	for _, tt := range []struct {
		skip []string
		want []string
	}{
		{[]string{"wh1"}, []string{"msg_3_wh2"}},
		{[]string{"wh2", "nope"}, []string{"msg_3_wh1", "msg_4_wh1"}},
		{[]string{"wh1", "wh2"}, []string{}},
	} {
		got, err := dl.PendingDeliveries(ctxT(t), 10, tt.skip)
		if err != nil || !reflect.DeepEqual(ids(got), tt.want) {
			t.Errorf("pending but %v: got %v, %v; want %v", tt.skip, ids(got), err, tt.want)
		}
	}
}

func testDeliveriesAttempts(t *testing.T, open func() arbiter.DeliveryLog) {
	dl := open()
	d := delivery(7, "wh1", dt0)
	if err := dl.EnqueueDeliveries(ctxT(t), []arbiter.Delivery{d}, 7); err != nil {
		t.Fatal(err)
	}
	next := dt1
	d.Attempts, d.LastStatus, d.LastError, d.NextAttemptAt, d.UpdatedAt = 1, 500, "server answered 500", &next, dt0
	if err := dl.RecordAttempt(ctxT(t), d, arbiter.DeliveryAttempt{N: 1, At: dt0, Status: 500, Error: "server answered 500", DurationMS: 1.5}); err != nil {
		t.Fatal(err)
	}
	d.Attempts, d.LastStatus, d.LastError, d.NextAttemptAt, d.State, d.UpdatedAt = 2, 204, "", nil, arbiter.DeliveryDelivered, dt1
	if err := dl.RecordAttempt(ctxT(t), d, arbiter.DeliveryAttempt{N: 2, At: dt1, Status: 204, DurationMS: 0.25}); err != nil {
		t.Fatal(err)
	}
	missing := delivery(99, "wh1", dt0)
	if err := dl.RecordAttempt(ctxT(t), missing, arbiter.DeliveryAttempt{N: 1, At: dt0}); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Errorf("unknown delivery: got %v, want not_found", err)
	}
	dl = reopenLog(t, dl, open)
	if ds := pending(t, dl, 10); len(ds) != 0 {
		t.Errorf("pending after delivery: %v", ids(ds))
	}
	got := list(t, dl, arbiter.DeliveryFilter{})
	if len(got) != 1 {
		t.Fatalf("list: %v", ids(got))
	}
	g := got[0]
	want := []arbiter.DeliveryAttempt{
		{N: 1, At: dt0, Status: 500, Error: "server answered 500", DurationMS: 1.5},
		{N: 2, At: dt1, Status: 204, DurationMS: 0.25},
	}
	if g.State != arbiter.DeliveryDelivered || g.Attempts != 2 || g.LastStatus != 204 || g.NextAttemptAt != nil || g.Body != nil || !g.UpdatedAt.Equal(dt1) {
		t.Errorf("delivery: %+v", g)
	}
	for i := range want {
		if i >= len(g.History) || !g.History[i].At.Equal(want[i].At) {
			t.Fatalf("history: got %+v, want %+v", g.History, want)
		}
		g.History[i].At = want[i].At
	}
	diff(t, "history", g.History, want)
}

func testDeliveriesList(t *testing.T, open func() arbiter.DeliveryLog) {
	dl := open()
	var ds []arbiter.Delivery
	for seq := int64(1); seq <= 6; seq++ {
		ds = append(ds, delivery(seq, "wh1", dt0), delivery(seq, "wh2", dt0))
	}
	if err := dl.EnqueueDeliveries(ctxT(t), ds, 6); err != nil {
		t.Fatal(err)
	}
	d := ds[0]
	d.State, d.Attempts = arbiter.DeliveryFailed, 1
	if err := dl.RecordAttempt(ctxT(t), d, arbiter.DeliveryAttempt{N: 1, At: dt0, Status: 410}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		f    arbiter.DeliveryFilter
		want []string
	}{
		{arbiter.DeliveryFilter{Limit: 3}, []string{"msg_6_wh2", "msg_6_wh1", "msg_5_wh2"}},
		{arbiter.DeliveryFilter{Webhook: "wh1", Limit: 2}, []string{"msg_6_wh1", "msg_5_wh1"}},
		{arbiter.DeliveryFilter{State: arbiter.DeliveryFailed}, []string{"msg_1_wh1"}},
		{arbiter.DeliveryFilter{Webhook: "wh2", State: arbiter.DeliveryFailed}, []string{}},
	}
	for _, c := range cases {
		if got := ids(list(t, dl, c.f)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%+v: got %v, want %v", c.f, got, c.want)
		}
	}
	if n := len(list(t, dl, arbiter.DeliveryFilter{})); n != 12 {
		t.Errorf("default limit: got %d, want all 12", n)
	}
	// A filtered list carries the attempts of its deliveries, and only those.
	for _, c := range []struct {
		f       arbiter.DeliveryFilter
		history map[string]int // id -> attempts listed
	}{
		{arbiter.DeliveryFilter{State: arbiter.DeliveryFailed}, map[string]int{"msg_1_wh1": 1}},
		{arbiter.DeliveryFilter{Webhook: "wh1", Limit: 1}, map[string]int{"msg_6_wh1": 0}},
		{arbiter.DeliveryFilter{Webhook: "wh1", State: arbiter.DeliveryFailed, Limit: 5}, map[string]int{"msg_1_wh1": 1}},
	} {
		got := map[string]int{}
		for _, d := range list(t, dl, c.f) {
			got[d.ID] = len(d.History)
			if len(d.History) > 0 && d.History[0].Status != 410 {
				t.Errorf("%+v: %s history %+v, want the 410 attempt", c.f, d.ID, d.History)
			}
		}
		if !reflect.DeepEqual(got, c.history) {
			t.Errorf("%+v: got attempts %v, want %v", c.f, got, c.history)
		}
	}
}

func testDeliveriesTrim(t *testing.T, open func() arbiter.DeliveryLog) {
	dl := open()
	var ds []arbiter.Delivery
	for seq := int64(1); seq <= 5; seq++ {
		ds = append(ds, delivery(seq, "wh1", dt0))
	}
	if err := dl.EnqueueDeliveries(ctxT(t), ds, 5); err != nil {
		t.Fatal(err)
	}
	// 1, 2 and 4 finish; 3 and 5 stay pending.
	for _, i := range []int{0, 1, 3} {
		d := ds[i]
		d.State, d.Attempts = arbiter.DeliveryDelivered, 1
		if err := dl.RecordAttempt(ctxT(t), d, arbiter.DeliveryAttempt{N: 1, At: dt0, Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	if err := dl.TrimDeliveries(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	if got, want := ids(list(t, dl, arbiter.DeliveryFilter{})), []string{"msg_5_wh1", "msg_4_wh1", "msg_3_wh1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("after trim: got %v, want %v (pending kept, newest finished kept)", got, want)
	}
}

func testDeliveriesAtomic(t *testing.T, open func() arbiter.DeliveryLog) {
	dl := open()
	ctx, cancel := context.WithCancel(ctxT(t))
	cancel()
	if err := dl.EnqueueDeliveries(ctx, []arbiter.Delivery{delivery(1, "wh1", dt0)}, 1); err == nil {
		t.Fatal("enqueue with a canceled context: got no error")
	}
	if c := cursor(t, dl); c != 0 {
		t.Errorf("cursor after a failed enqueue: %d", c)
	}
	if ds := pending(t, dl, 10); len(ds) != 0 {
		t.Errorf("deliveries after a failed enqueue: %v", ids(ds))
	}
}
