package main

import (
	"context"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpapi"
	"github.com/arbiter-hq/arbiter/ui"
	"github.com/arbiter-hq/arbiter/webhook"
)

// coordServer is what the server runs for coordination beside the control
// loop: the webhook dispatcher.
type coordServer struct {
	dispatcher *webhook.Dispatcher
	stop       context.CancelFunc
	done       chan struct{}
	// deliveries is the delivery log the dispatcher writes through, which
	// tells the dashboard of each change (ui.DeliveryWatch).
	deliveries *ui.DeliveryWatch
}

// openCoord starts the webhook dispatcher when the store keeps a delivery
// log; applyConfig has declared the services and their catalogs.
func (m *serverMain) openCoord(ctx context.Context) error {
	dl, ok := m.store.(arbiter.DeliveryLog)
	if !ok {
		m.log.Warn("this store keeps no webhook delivery log: webhooks are not delivered")
		return nil
	}
	watch := ui.WatchDeliveries(dl)
	w := m.cfg.Webhooks
	d := webhook.New(webhook.Options{
		Plane:          m.loop,
		Log:            watch,
		Timeout:        durationS(w.TimeoutS),
		MinBackoff:     durationS(w.RetryMinS),
		MaxBackoff:     durationS(w.RetryMaxS),
		RetryFor:       durationS(w.RetryForS),
		Workers:        w.Workers,
		Keep:           w.Keep,
		AllowLinkLocal: w.AllowLinkLocal,
		UserAgent:      "arbiter-webhook/" + version,
		Logger:         m.log,
	})
	// The dispatcher runs beside the loop until Close: it only reads the
	// loop's committed events, so a receiver that is slow, down or failing
	// never delays a decision.
	dctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Stopped on purpose (a shutdown, a failed start) is no error.
		if err := d.Run(dctx); err != nil && dctx.Err() == nil {
			m.log.Error("webhook dispatcher stopped", "err", err)
		}
	}()
	m.coord = coordServer{dispatcher: d, stop: cancel, done: done, deliveries: watch}
	return nil
}

// coordOptions configure the coordination API.
func (m *serverMain) coordOptions() httpapi.CoordOptions {
	o := httpapi.CoordOptions{AllowLinkLocalWebhooks: m.cfg.Webhooks.AllowLinkLocal, Now: m.now}
	if m.coord.deliveries != nil {
		o.Deliveries = m.coord.deliveries
	} else if dl, ok := m.store.(arbiter.DeliveryLog); ok {
		o.Deliveries = dl
	}
	return o
}

// closeCoord stops the dispatcher; deliveries in flight stay pending in the
// log for the next start. Safe to call twice.
func (m *serverMain) closeCoord() {
	if m.coord.stop == nil {
		return
	}
	m.coord.stop()
	select {
	case <-m.coord.done:
	case <-time.After(30 * time.Second):
		m.log.Warn("webhook dispatcher did not stop in time")
	}
	m.coord = coordServer{}
}
