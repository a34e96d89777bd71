package main

import "testing"

func TestExports(t *testing.T) {
	got := exports(map[string]string{"B": "x'y", "A": "mongodb://h/?a=1&b=2"})
	want := "export A='mongodb://h/?a=1&b=2'\nexport B='x'\\''y'\n"
	if got != want {
		t.Errorf("exports = %q, want %q", got, want)
	}
}
