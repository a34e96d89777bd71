package otelidem_test

import "github.com/exactlyonce/idempotency/store/memory"

// memStore is memory.New for options the test knows to be valid.
func memStore(opts *memory.Options) *memory.Store {
	s, err := memory.New(opts)
	if err != nil {
		panic(err)
	}
	return s
}
