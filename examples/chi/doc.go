// Package chi shows the httpidem middleware on a chi router.
package chi
