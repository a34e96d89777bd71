// Package echo shows the httpidem middleware on an echo server.
package echo
