package main

import "errors"

// errTodo is what the remaining stubs (server, agent) return. The client
// commands are all implemented; delete this file with the last stub.
var errTodo = errors.New("not implemented yet")
