// Package arbiter is the vocabulary of the arbiter control plane: machines and
// their devices, allocations and the requests that create them, events, the
// commands the engine accepts, the error type with its codes, and the Store
// interface that durable backends implement.
//
// It imports only the standard library. Decisions live in engine and place;
// transports (httpapi, spalloc) and stores (sqlite, postgres) are adapters that
// speak this vocabulary.
package arbiter
