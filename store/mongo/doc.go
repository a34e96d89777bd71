// Package mongo is an [idempotency.Store] on MongoDB 5.0 or later through
// the official Go driver (go.mongodb.org/mongo-driver/v2), one document per
// record in a collection of the caller's, with the storage key as _id.
//
// Every decision is one single-document write judged by the server's
// clock ($$NOW), never the client's:
//
//   - Claim is one findAndModify with upsert, whose filter matches only a
//     record the claim acquires (absent, expired or released, a repeat of
//     the holder's own claim, or a takeover of an ended lease) and whose
//     update is an aggregation pipeline that writes the new record. When
//     the record may not be acquired (another holder's live lease, a
//     completed record, another fingerprint), the upsert's insert fails
//     with a duplicate key error (E11000) and one read of that record, in
//     the same causally consistent session, gives the outcome; the error
//     alone is never taken for "not claimed".
//   - Renew, Checkpoint, Complete and Release are each one update whose
//     filter requires the holder's token on a live record.
//   - [Store.ClaimBatch] and [Store.FinishBatch] ([idempotency.Batcher],
//     for idempotency.DoBatch) send those same writes, one statement per
//     item, as one unordered bulk write, and read the records of the
//     batch with one find: a batch of up to [MaxBatch] items costs two
//     commands to claim and one to finish.
//
// Fences are the server's clock in milliseconds at the acquisition, or one
// more than the record's previous fence when that is greater, so they grow
// across takeovers whatever the clock does. Release does not delete the
// document: it leaves a released record (key, fence and an expiry of now),
// absent to every operation. No document is deleted, by the TTL index or
// by [Store.Sweep], before the server's clock has passed its fence, so a
// record created after a deletion gets a greater fence from the clock; the
// README spells out the one case where it cannot (the server's clock
// stepped back after a deletion).
//
// Expiry is judged on every operation (an expired record is absent);
// deletion is the TTL monitor's (about once a minute) or Sweep's, and
// correctness never depends on when it runs.
//
// Writes use write concern majority and the reads after a refused write
// read concern majority by default; [Options] can lower them, at the cost
// the package README describes. [Store.Watch] uses change streams, which
// replica sets and sharded clusters have and a standalone server does not.
package mongo
