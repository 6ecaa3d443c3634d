/* The stream's attempts: the newest attempt seen, each failover banner's text (from the socket's
 * "attempts" message) and the Attempt filter, whose <select> gets an option per attempt seen. */

export function createAttempts(select) {
  const attempts = {
    newest: 0,
    filter: 0, // 0: every attempt
    banners: {},

    note(attempt) {
      if (attempt > attempts.newest) {
        attempts.newest = attempt;
        addOptions();
      }
    },

    setBanners(banners) {
      Object.keys(banners).forEach((k) => { attempts.banners[k] = banners[k]; attempts.note(parseInt(k, 10)); });
    },

    bannerText(attempt) {
      return attempts.banners[attempt] || "Attempt " + attempt + " started";
    },

    setFilter(attempt) {
      attempts.filter = attempt;
      select.value = attempt ? String(attempt) : "";
    }
  };

  function addOptions() {
    const have = select.options.length - 1;
    for (let n = have + 1; n <= attempts.newest; n++) {
      const option = document.createElement("option");
      option.value = String(n);
      option.textContent = "Attempt " + n;
      select.appendChild(option);
    }
  }

  return attempts;
}
