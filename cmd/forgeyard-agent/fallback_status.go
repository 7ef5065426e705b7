package main

import "forgeyard.dev/transport/semantics/agent"

// fallbackReason is why the agent uses its current backend
// (agent.Status.FallbackReason: which candidates failed or were slower, a
// remembered choice, a move back, and a probe's progress).
func fallbackReason(st agent.Status) string { return st.FallbackReason }
