package outbox

// TableName is the unqualified name of t's table.
func TableName(t *Table) string { return t.opts.Table }

// Channel is the notification channel of t's table.
func Channel(t *Table) string { return t.channel }
