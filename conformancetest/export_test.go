package conformancetest

// CaseNames lists the suite's cases in table order, and whether each runs
// with the others at once, for the self-test in broken_test.go.
func CaseNames() (names []string, together []bool) {
	for _, c := range cases {
		names = append(names, c.name)
		together = append(together, c.together)
	}
	return names, together
}
