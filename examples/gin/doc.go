// Package gin shows the httpidem middleware in front of a gin engine.
package gin
