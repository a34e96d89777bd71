// Package integration runs the HTTP scenario of httpidem on the PostgreSQL
// and Redis stores, and grpcidem's interceptors on PostgreSQL's
// transactional mode, against real servers (IDEM_POSTGRES_URL,
// IDEM_REDIS_ADDR; scripts/test.sh starts them).
package integration
