"""One step of a sequence: its revealed body, the flow from reveal to record, its views."""
