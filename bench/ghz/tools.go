//go:build tools

// Package ghz pins ghz, the gRPC load generator bench/bench_grpc.py drives:
// go.mod and go.sum fix its version and every module it pulls in, and
// `go build github.com/bojand/ghz/cmd/ghz` in this folder builds it.
package ghz

import _ "github.com/bojand/ghz/cmd/ghz"
