# The demo of `safeaccess-server demo`, from R: a researcher seals a sequence whose early
# analyses are safe and one (ethnicity by region) has cells below the threshold; the centre
# releases, then withholds, and the analyses after the withhold are never revealed. Then a DP
# sequence on the same people, and an auditor verifies the log. Run by scripts/demo-r.
library(safeaccess)

rows <- as.integer(Sys.getenv("SAFEACCESS_DEMO_ROWS", "20000"))
cat(sprintf("Preparing a safe access centre with %d generated census records ...\n", rows))
centre <- sa_demo_centre(rows = rows)
cat(sprintf("Server listening on %s\n\n", centre$url))

demo <- function(centre) {
  session <- sa_connect(centre$url, centre$key, centre$researcher)
  plan <- sa_plan(session, "census") |>
    sa_frequency_table("region", "sex") |>
    sa_ols(income ~ age + factor(sex), where = "employment == 'employed'") |>
    sa_magnitude_table(income ~ region, agg = "mean", where = "age >= 30") |>
    sa_frequency_table("ethnicity", "region") |>
    sa_frequency_table("health", "ethnicity")
  print(plan)
  sa_rehearse(plan)
  sealed <- sa_seal(session, plan)
  cat(sprintf(paste0(
    "\n%s seals %d analyses into one binding sequence and signs its header;\n",
    "the server sees each analysis only when she reveals it, after the previous output was released.\n\n"
  ), centre$researcher, sealed$steps))

  show <- function(step) {
    cat("---", step$description, "\n")
    if (step$released) print(as.data.frame(step))
    cat("\n")
  }
  results <- sa_run(session, sealed, on_step = show)
  last <- results[[length(results)]]
  cat(sprintf("Sequence %s: %s.\n", last$sequence_id, last$sequence_state))
  if (last$index < sealed$steps) {
    cat(sprintf("%d analysis(es) after step %d were never revealed: the centre holds only their place in the hash chain.\n",
                sealed$steps - last$index, last$index))
  }

  folder <- file.path(centre$dir, "census-results")
  sa_save(results, folder)
  grDevices::png(file.path(folder, "region-by-sex.png"), width = 800, height = 500)
  plot(results[[1]])
  invisible(grDevices::dev.off())
  cat(sprintf("\nSaved the results folder (outputs, receipts, the sealed sequence, a plot) in %s\n", folder))
  print(sa_check_receipt(session, file.path(folder, "receipts", "01.json")))

  cat("\nDataset census-dp holds the same people but answers only with differential privacy.\n")
  dp <- sa_plan(session, "census-dp") |>
    sa_dp_count(by = "region", epsilon = 0.5, delta = 1e-7) |>
    sa_dp_mean(c("age", "income"), by = "sex", epsilon = 1, delta = 1e-7, region = TRUE) |>
    sa_dp_histogram("age", c(16, 25, 35, 45, 55, 65, 75, 95), epsilon = 1, delta = 1e-7)
  sa_dp_count(dp, by = "employment", epsilon = 1.5, delta = 1e-7)
  refused <- tryCatch(sa_seal(session, dp), safeaccess_AnalysisInvalid = function(e) e)
  cat("A fourth DP request does not fit the budget; the centre refuses it before anything is sealed:\n")
  cat(conditionMessage(refused), "\n\n")
  dp <- sa_plan(session, "census-dp") |>
    sa_dp_count(by = "region", epsilon = 0.5, delta = 1e-7) |>
    sa_dp_mean(c("age", "income"), by = "sex", epsilon = 1, delta = 1e-7, region = TRUE) |>
    sa_dp_histogram("age", c(16, 25, 35, 45, 55, 65, 75, 95), epsilon = 1, delta = 1e-7)
  dp_results <- sa_run(session, sa_seal(session, dp), on_step = show)

  cat("An auditor verifies the centre's audit log:\n")
  report <- sa_audit_verify(centre$url, centre$auditor_key, centre$auditor)
  print(report)

  released <- sum(vapply(results, `[[`, TRUE, "released"))
  dp_released <- sum(vapply(dp_results, `[[`, TRUE, "released"))
  released >= 1 && (last$status == "withheld" || isTRUE(last$last)) && dp_released >= 2
}

ok <- tryCatch(demo(centre), finally = sa_stop_centre(centre))
if (!ok) quit(status = 1)
