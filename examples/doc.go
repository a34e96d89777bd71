// Package examples holds runnable examples of the httpidem middleware with
// web frameworks (chi, gin, echo), its integration tests on the
// PostgreSQL and Redis stores, and a reconciler on each of the five
// stores (package reconcile). It is a module of its own, so the root
// module never depends on a framework or a driver.
package examples
