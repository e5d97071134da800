//go:build !unix

package main

// openFilesLimit: no such limit to read on this platform.
func openFilesLimit() (uint64, bool) { return 0, false }
