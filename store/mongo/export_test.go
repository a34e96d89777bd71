package mongo

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// StuckQuery is the filter and sort of the first page of Stuck at now,
// for the real-server tests' explain.
func StuckQuery(now time.Time) (filter, sort bson.D) {
	keys, _ := startedIndex()
	return stuckFilter(now, stuckCursor{}), keys
}
