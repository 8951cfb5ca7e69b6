"""The ledger client a broker uses: facade, bookie pool, writer (with ensemble change), reader,
recovery, and the log reader across ledgers."""
