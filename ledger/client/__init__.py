"""The ledger client a broker uses: facade, bookie pool, writer, reader, recovery."""
