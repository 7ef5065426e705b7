package main

import "forgeyard.dev/transport/semantics/agent"

// fallbackReason is why the agent uses its current backend, when
// agent.Status says ("" until the agent exposes it).
func fallbackReason(agent.Status) string { return "" }
