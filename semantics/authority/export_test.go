package authority

// SchemaVersion is the newest schema version this build knows (for tests).
func SchemaVersion() int { return schemaVersion() }
