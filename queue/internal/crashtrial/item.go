package crashtrial

// An Item is one request of a trial, as the client sends it in its body
// and the server records it in its ledger.
type Item struct {
	Trial int    `json:"trial"`
	Index int    `json:"item"`
	Order string `json:"order"`
	Seq   int    `json:"seq"`
}
