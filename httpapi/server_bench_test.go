package httpapi

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkServerAllocate measures the HTTP layer of POST /api/v1/allocations
// over the fake plane: auth, decoding, validation, encoding.
func BenchmarkServerAllocate(b *testing.B) {
	f := newFakePlane()
	s := NewServer(Options{Plane: f, Tokens: testTokens, Metrics: NewMetrics(f)})
	h := s.Handler()
	body := `{"owner":"bob","gpus":2,"min_vram_gib":40,"tags":["a"],"keepalive_s":120}`
	b.ReportAllocs()
	for b.Loop() {
		r := testRequest("POST", "/api/v1/allocations", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+testUser)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 201 {
			b.Fatalf("got %d: %s", w.Code, w.Body)
		}
	}
}

// BenchmarkServerGetAllocation measures GET /api/v1/allocations/{id}.
func BenchmarkServerGetAllocation(b *testing.B) {
	f := newFakePlane()
	s := NewServer(Options{Plane: f, Tokens: testTokens, Metrics: NewMetrics(f)})
	h := s.Handler()
	r := testRequest("POST", "/api/v1/allocations", strings.NewReader(`{"owner":"bob","gpus":1}`))
	r.Header.Set("Authorization", "Bearer "+testUser)
	h.ServeHTTP(httptest.NewRecorder(), r)
	b.ReportAllocs()
	for b.Loop() {
		r := testRequest("GET", "/api/v1/allocations/1", nil)
		r.Header.Set("Authorization", "Bearer "+testUser)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 200 {
			b.Fatalf("got %d: %s", w.Code, w.Body)
		}
	}
}
