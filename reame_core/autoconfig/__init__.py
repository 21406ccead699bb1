"""Host auto-configuration: `facts` reads what the machine offers, `plan` decides what
Reame runs with and why. Explicit settings always win over what is decided here."""
