# Base R plots of released outputs draw the released numbers; the survival curve released by
# the centre is R's own survfit() on the records.

on_device <- function(code) {
  grDevices::pdf(tempfile(fileext = ".pdf"))
  on.exit(grDevices::dev.off())
  force(code)
}

test_that("the released Kaplan-Meier curve is survival::survfit's, and plots as its steps", {
  result <- cohort_run()
  expect_equal(vapply(result, `[[`, "", "status"), "released")
  frame <- as.data.frame(result[[1]])
  records <- cohort_records()
  late <- records$days > 720
  records$time <- ceiling(ifelse(late, 720, records$days) / 90) * 90
  records$event <- ifelse(late, 0, records$died)
  fit <- survival::survfit(survival::Surv(time, event) ~ arm, data = records)
  strata <- rep(sub("arm=", "", names(fit$strata)), fit$strata)
  for (arm in c("a", "b")) {
    mine <- frame[frame$arm == arm, ]
    keep <- strata == arm & fit$n.event > 0
    expect_equal(mine$time, fit$time[keep])
    expect_equal(mine$at_risk, as.integer(fit$n.risk[keep]))
    expect_equal(mine$events, as.integer(fit$n.event[keep]))
    expect_equal(mine$survival, fit$surv[keep], tolerance = 1e-12)
  }
  curves <- on_device(plot(result[[1]]))
  expect_equal(vapply(curves, `[[`, "", "label"), c("a", "b"))
  expect_equal(curves[[2]]$time, c(0, frame$time[frame$arm == "b"]))
  expect_equal(curves[[2]]$survival, c(1, frame$survival[frame$arm == "b"]))
})

test_that("tables, histograms and regressions plot their released numbers", {
  run <- common_run()
  table <- as.data.frame(run$results[[1]])
  heights <- on_device(plot(run$results[[1]]))
  expect_equal(unname(heights[, "F"]), as.numeric(table$F))
  expect_equal(rownames(heights), table$region)

  histogram <- as.data.frame(run$results[[4]])
  bars <- on_device(plot(run$results[[4]]))
  expect_equal(unname(bars[1, ]), as.numeric(unlist(histogram[1, ])))

  coefficients <- as.data.frame(run$results[[3]])
  drawn <- on_device(plot(run$results[[3]]))
  slopes <- coefficients[coefficients$term != "Intercept", ]
  expect_equal(drawn$estimate, slopes$estimate)
  expect_equal(drawn$high - drawn$estimate, qnorm(0.975) * slopes$std_error)
})

test_that("nothing released or nothing to draw is an error saying so", {
  run <- common_run()
  expect_error(on_device(plot(withheld_run()$results[[2]])),
               "step 2 is withheld: nothing was released to plot")
  expect_error(on_device(plot(run$results[[5]])), "a test output has no plot")
})

test_that("DP answers are frames like Python's and plot their estimates with 95 % whiskers", {
  dp <- dp_run()
  expect_equal(vapply(dp, `[[`, "", "status"), c("released", "released"))
  for (step in dp) {
    expect_equal(names(as.data.frame(step)), python_frame(step)$names)
  }
  counts <- as.data.frame(dp[[1]])
  drawn <- on_device(plot(dp[[1]]))
  expect_equal(drawn$group, counts$region)
  expect_equal(drawn$estimate, counts$count)
  expect_equal(drawn$high - drawn$estimate, qnorm(0.975) * counts[["se count"]])
  means <- as.data.frame(dp[[2]])
  drawn <- on_device(plot(dp[[2]]))
  expect_equal(drawn$term, paste(means$sex, means$variable, sep = ", "))
  expect_equal(drawn$estimate, means$mean)
  expect_equal(drawn$estimate - drawn$low, qnorm(0.975) * means$std_error)
})
