// Package queue is a durable, ordered queue of HTTP requests for clients
// that retry hours later: a point-of-sale agent, a command that submits
// when the network is back, a service that must deliver calls to a
// partner API without running a database server.
package queue
