"""safeaccess researcher library: protocol, analysis language, session, CA and auditor tools."""
