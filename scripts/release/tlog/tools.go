//go:build tools

// Pins Tessera's posix-oneshot (the command that appends to the log) in this module, so
// scripts/release/log.sh builds it at the version go.sum records.
package main

import _ "github.com/transparency-dev/tessera/cmd/examples/posix-oneshot"
